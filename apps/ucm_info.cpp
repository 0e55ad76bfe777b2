// ucm_info: what this build of ucmcache is, how it is configured, and what it
// sees on this node, as ucx_info and ompi_info do for theirs.
//
//   ucm_info -v            version and build options
//   ucm_info -c            every tunable: value, default, source
//   ucm_info -f            the same with help text
//   ucm_info -d            this node: CPUs, NUMA nodes, GPUs, hugepages, memfd
//   ucm_info --parsable    any of the above as `section:key:value` lines (a
//                          tunable's: field, value, default, source, type,
//                          values, layout, and with -f help)
//   mpirun -np 4 ucm_info  (or -b) the per-rank bootstrap view: every rank
//                          builds the node-shared cache and prints one line
//
// -v, -c, -f and -d never start MPI: they run on a login node, in a container
// without a launcher, or in a script. Only the bootstrap view calls MPI_Init,
// and it is the default when a launcher started the process (mpirun, srun).
//
// The bootstrap view uses the public C API only. The rest reads the library's
// internals (the tunables' table, the topology, the data plane's hugepage
// probe): ucm_info is the project's own tool and links the core statically.
// The C API's usability from C is proven by tests/install/consumer.c.
#include <sys/mman.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "api/tunables_view.h"
#include "common/log.h"
#include "data/buffer_data.h"
#include "device/copy_engine.h"
#include "topo/node_view.h"
#include "ucm_build_config.h"
#include "ucmcache/ucm.h"
#if UCM_HAVE_MPI
#include <mpi.h>
#endif

namespace {

struct Options {
  bool version = false, config = false, help_text = false, node = false, bootstrap = false, parsable = false;
};

void usage(FILE* to) {
  std::fprintf(to,
               "usage: ucm_info [-v] [-c] [-f] [-d] [-b] [--parsable] [-h]\n"
               "  -v, --version    version and build options (MPI, hwloc, CUDA, NCCL, NVTX, compiler)\n"
               "  -c, --config     every tunable: current value, default and source (default, environment)\n"
               "  -f, --full       as -c, with each tunable's help text\n"
               "  -d, --devices    this node: CPUs, NUMA nodes, GPUs and their nearest cores, hugepages,\n"
               "                   and whether init will map the data plane on hugetlb pages\n"
               "  -b, --bootstrap  the per-rank bootstrap view (calls MPI_Init; the default when\n"
               "                   started by mpirun or srun)\n"
               "      --parsable   print section:key:value lines for scripts\n"
               "  -h, --help       this text\n");
}

// A launcher started this process: the variables Open MPI, PMIx (srun
// --mpi=pmix) and PMI-1/2 (MPICH's hydra, srun --mpi=pmi2) give each rank.
bool under_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

const char* yes(bool b) { return b ? "yes" : "no"; }

void print_version(const Options& o) {
  const bool nccl_built = ucm::device_status().nccl_built;
  if (o.parsable) {
    std::printf("version:ucmcache:%s\n", ucm_version_string());
    std::printf("build:mpi:%s\nbuild:mpi_version:%s\n", yes(UCM_HAVE_MPI), UCM_BUILD_MPI_VERSION);
    std::printf("build:hwloc:%s\nbuild:hwloc_version:%s\n", yes(UCM_HAVE_HWLOC), UCM_BUILD_HWLOC_VERSION);
    std::printf("build:cuda:%s\nbuild:cuda_version:%s\n", yes(UCM_HAVE_CUDA), UCM_BUILD_CUDA_VERSION);
    std::printf("build:nccl:%s\nbuild:nccl_found:%s\n", yes(nccl_built), yes(UCM_HAVE_NCCL));
    std::printf("build:nvtx:%s\n", yes(UCM_HAVE_NVTX));
    std::printf("build:compiler:%s\nbuild:buildtype:%s\nbuild:prefix:%s\n", UCM_BUILD_COMPILER, UCM_BUILD_TYPE,
                UCM_BUILD_PREFIX);
    return;
  }
  std::printf("ucmcache %s\n", ucm_version_string());
  auto with = [](bool b, const char* v) { return std::string(yes(b)) + (b && *v ? std::string(" (") + v + ")" : ""); };
  std::printf("  mpi:       %s\n", with(UCM_HAVE_MPI, UCM_BUILD_MPI_VERSION).c_str());
  std::printf("  hwloc:     %s\n", with(UCM_HAVE_HWLOC, UCM_BUILD_HWLOC_VERSION).c_str());
  std::printf("  cuda:      %s\n", with(UCM_HAVE_CUDA, UCM_BUILD_CUDA_VERSION).c_str());
  std::printf("  nccl:      %s%s\n", yes(nccl_built),
              !nccl_built && UCM_HAVE_NCCL ? " (found at configure time; the library does not call it)" : "");
  std::printf("  nvtx:      %s\n", UCM_HAVE_NVTX ? "yes (ranges in the ucmcache domain, for Nsight Systems)" : "no");
  std::printf("  compiler:  %s\n  buildtype: %s\n  prefix:    %s\n", UCM_BUILD_COMPILER, UCM_BUILD_TYPE,
              UCM_BUILD_PREFIX);
}

int print_config(const Options& o) {
  std::vector<ucm::TunableRow> rows;
  if (ucm::tunables_view(&rows) != ucm::Result::kOk) {
    std::fprintf(stderr, "ucm_info: %s\n", ucm::last_error().c_str());
    return 1;
  }
  for (const ucm::TunableRow& r : rows) {
    const std::string name = r.env.empty() ? r.field : r.env;
    if (o.parsable) {
      std::printf("tunable:%s:field:%s\n", name.c_str(), r.field.c_str());
      std::printf("tunable:%s:value:%s\n", name.c_str(), r.value.c_str());
      std::printf("tunable:%s:default:%s\n", name.c_str(), r.default_value.c_str());
      std::printf("tunable:%s:source:%s\n", name.c_str(), r.source.c_str());
      std::printf("tunable:%s:type:%s\n", name.c_str(), r.type.c_str());
      std::printf("tunable:%s:values:%s\n", name.c_str(), r.bounds.c_str());
      std::printf("tunable:%s:layout:%s\n", name.c_str(), yes(r.layout));
      if (o.help_text) std::printf("tunable:%s:help:%s\n", name.c_str(), r.help.c_str());
      continue;
    }
    std::printf("%-22s = %-14s (default %s; %s)\n", name.c_str(), r.value.empty() ? "\"\"" : r.value.c_str(),
                r.default_value.empty() ? "none" : r.default_value.c_str(), r.source.c_str());
    if (o.help_text) std::printf("    %s\n    values: %s\n", r.help.c_str(), r.bounds.c_str());
  }
  return 0;
}

// "HugePages_Free:  12" -> 12; -1 when absent.
long long meminfo(const char* key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(in, line))
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') return std::atoll(line.c_str() + n + 1);
  return -1;
}

struct Out {
  bool parsable;
  void kv(const std::string& key, const std::string& value, const char* human) const {
    if (parsable) std::printf("node:%s:%s\n", key.c_str(), value.c_str());
    else std::printf("  %-24s %s\n", human, value.c_str());
  }
};

// The data plane's hugepage size (2 MiB).
constexpr uint64_t kHuge = 2ull << 20;

// The CPUs, NUMA nodes and GPUs, with the CPUs nearest each GPU.
void print_topology(const Out& out) {
  const ucm::NodeView v = ucm::node_view();
  out.kv("cpus:online", std::to_string(v.online_cpus), "cpus online:");
  out.kv("cpus:allowed", v.allowed, "cpus allowed:");
  if (v.hwloc) {
    out.kv("packages", std::to_string(v.packages), "packages:");
    out.kv("cores", std::to_string(v.cores), "cores:");
    out.kv("pus", std::to_string(v.pus), "hardware threads:");
    out.kv("numa:count", std::to_string(v.numa.size()), "numa nodes:");
    for (const ucm::NumaView& n : v.numa)
      out.kv("numa:" + std::to_string(n.os_index) + ":cpus", n.cpus,
             ("  numa " + std::to_string(n.os_index) + " cpus:").c_str());
  } else {
    out.kv("topology:why", v.why, "topology:");
  }

  std::string why;
  const std::vector<std::string> gpus = ucm::gpu_bus_ids(&why);
  out.kv("gpu:count", std::to_string(gpus.size()), "gpus:");
  if (gpus.empty()) out.kv("gpu:why", why.empty() ? "the CUDA runtime reports no device" : why, "  why none:");
  for (size_t i = 0; i < gpus.size(); ++i) {
    const std::string d = "gpu:" + std::to_string(i);
    std::string where;
    const std::string cpus = ucm::cpus_near_pci(gpus[i], &where);
    out.kv(d + ":pci", gpus[i], ("  gpu " + std::to_string(i) + " pci:").c_str());
    out.kv(d + ":cpus", cpus.empty() ? "unknown" : cpus, "    nearest cpus:");
    out.kv(d + ":near", where, "    nearest object:");
  }
}

// Hugepages, the memory budget and what memfd allows.
void print_memory(const Out& out) {
  const long long page_kb = meminfo("Hugepagesize");
  out.kv("hugepages:size_kb", std::to_string(page_kb), "hugepage size (kB):");
  out.kv("hugepages:total", std::to_string(meminfo("HugePages_Total")), "hugepages total:");
  out.kv("hugepages:free", std::to_string(meminfo("HugePages_Free")), "hugepages free:");
  const ucm::MemoryBudget budget = ucm::memory_budget();
  out.kv("memory:available", std::to_string(budget.available), "memory available (B):");
  out.kv("memory:available_from", budget.available_from, "  from:");

  const int fd = memfd_create("ucm_info", MFD_CLOEXEC);
  out.kv("memfd", yes(fd >= 0), "memfd:");
  if (fd >= 0) close(fd);
  out.kv("memfd_hugetlb", yes(ucm::hugepages_available(kHuge)), "memfd hugetlb (2 MiB):");
}

// What init would do with the data plane in this environment (one per node).
int print_init_plan(const Out& out) {
  ucm_config_t cfg;
  if (ucm_config_init(&cfg) != UCM_OK) {
    out.kv("init:error", ucm_config_error(), "init would fail:");
    return 1;
  }
  const uint64_t slots = cfg.cache_bytes / (cfg.shard_bytes ? cfg.shard_bytes : 1) + cfg.reserved_slots;
  const uint64_t bytes = (slots * cfg.shard_bytes + kHuge - 1) / kHuge * kHuge;
  const char* policy = cfg.hugepages == UCM_HUGEPAGES_ON ? "on" : cfg.hugepages == UCM_HUGEPAGES_OFF ? "off" : "auto";
  std::string pages;
  if (cfg.hugepages == UCM_HUGEPAGES_OFF) pages = "ordinary (hugepages=off)";
  else if (ucm::hugepages_available(bytes)) pages = "hugetlb";
  else if (cfg.hugepages == UCM_HUGEPAGES_ON) pages = "none: init fails (hugepages=on, not enough free 2 MiB pages)";
  else pages = "ordinary (hugepages=auto falls back: not enough free 2 MiB pages)";
  out.kv("init:hugepages", policy, "init hugepages policy:");
  out.kv("init:data_bytes", std::to_string(bytes), "init data plane (B):");
  out.kv("init:pages", pages, "init data plane pages:");
  return 0;
}

int print_node(const Options& o) {
  const Out out{o.parsable};
  char host[256] = {};
  (void)gethostname(host, sizeof(host) - 1);
  if (!o.parsable) std::printf("node %s\n", host);
  else std::printf("node:host:%s\n", host);
  print_topology(out);
  print_memory(out);
  return print_init_plan(out);
}

#if UCM_HAVE_MPI
// The bootstrap view's line for one rank ("rank 0/4 host=... ").
constexpr size_t kLineBytes = 2400;
void info_line(const ucm_cache_info_t& info, char (&line)[kLineBytes]) {
  const int used = std::snprintf(
      line, sizeof(line),
      "rank %d/%d host=%s node=%d/%d local_rank=%d local_size=%d device=%d engine=%s scheduler=%d "
      "hugetlb=%d data_bytes=%llu segments=%u control_bytes=%llu control_inode=%llu slots=%u+%u "
      "cuda=%s(%d visible) nccl=%s hwloc=%s bound=%d binding=\"%s\"",
      info.rank, info.size, info.host, info.node_id, info.node_count, info.local_rank, info.local_size,
      info.device_id, info.scheduler ? "none" : info.copy_engine, info.scheduler, info.hugetlb,
      static_cast<unsigned long long>(info.data_bytes), info.segments,
      static_cast<unsigned long long>(info.control_bytes), static_cast<unsigned long long>(info.control_inode),
      info.regular_slots, info.reserved_slots, info.cuda_built ? "built" : "not-built", info.visible_devices,
      info.nccl_built ? "built" : "not-built", info.hwloc_built ? "built" : "not-built", info.threads_bound,
      info.binding);
  if (used > 0 && static_cast<size_t>(used) < sizeof(line))
    std::snprintf(line + used, sizeof(line) - static_cast<size_t>(used),
                  " register=%.3fs(%u threads, %.3f s/GiB) device_choice=\"%s\" pages=\"%s\" fanout=\"%s\"",
                  info.register_seconds, info.register_threads,
                  info.data_bytes ? info.register_seconds / (static_cast<double>(info.data_bytes) / (1 << 30)) : 0.0,
                  info.device_choice, info.pages, info.fanout);
  if (const size_t at = std::strlen(line); at < sizeof(line))
    std::snprintf(line + at, sizeof(line) - at,
                  " init=%.3fs populate=%.3fs(%u threads) numa=\"%s\" control_pages=\"%s\"", info.init_seconds,
                  info.populate_seconds, info.populate_threads, info.numa, info.control_pages);
}

// Every rank builds the node-shared cache and prints one line about what it
// got; lines come out in rank order through rank 0.
int bootstrap_view(int rank, int size) {
  ucm_config_t cfg;
  ucm_result_t r = ucm_config_init(&cfg);
  if (r != UCM_OK) {
    std::fprintf(stderr, "rank %d: %s: %s\n", rank, ucm_result_string(r), ucm_config_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  // ucm_info needs a store only to start: a sim store unless one is given.
  if (cfg.backend[0] == '\0') std::snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=0");
  if (!std::getenv("UCM_CACHE_BYTES")) cfg.cache_bytes = 64ull << 20;

  ucm_cache_t cache = nullptr;
  r = ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache);
  if (r != UCM_OK) {
    std::fprintf(stderr, "rank %d: ucm_cache_init: %s: %s\n", rank, ucm_result_string(r), ucm_last_error(nullptr));
    return 1;
  }
  ucm_cache_info_t info;
  std::memset(&info, 0, sizeof(info));
  info.struct_bytes = sizeof(info);
  r = ucm_cache_info(cache, &info);
  if (r != UCM_OK) {
    std::fprintf(stderr, "rank %d: ucm_cache_info: %s\n", rank, ucm_last_error(cache));
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  char line[kLineBytes];
  info_line(info, line);
  if (rank == 0) {
    std::printf("%s\n", line);
    for (int i = 1; i < size; ++i) {
      char other[sizeof(line)];
      MPI_Recv(other, sizeof(other), MPI_CHAR, i, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      std::printf("%s\n", other);
    }
    std::fflush(stdout);
  } else {
    MPI_Send(line, sizeof(line), MPI_CHAR, 0, 7, MPI_COMM_WORLD);
  }
  r = ucm_cache_finalize(&cache);
  if (r != UCM_OK) std::fprintf(stderr, "rank %d: ucm_cache_finalize: %s\n", rank, ucm_last_error(nullptr));
  return r == UCM_OK ? 0 : 1;
}
#endif

// The command line into *o: -1 to go on, else the exit code (--help, a bad option).
int parse_args(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--parsable") o->parsable = true;
    else if (a == "-h" || a == "--help") return usage(stdout), 0;
    else if (a == "--version") o->version = true;
    else if (a == "--config") o->config = true;
    else if (a == "--full") o->config = o->help_text = true;
    else if (a == "--devices") o->node = true;
    else if (a == "--bootstrap") o->bootstrap = true;
    else if (a.size() >= 2 && a[0] == '-' && a[1] != '-') {
      for (size_t k = 1; k < a.size(); ++k) {
        switch (a[k]) {
          case 'v': o->version = true; break;
          case 'c': o->config = true; break;
          case 'f': o->config = o->help_text = true; break;
          case 'd': o->node = true; break;
          case 'b': o->bootstrap = true; break;
          default:
            std::fprintf(stderr, "ucm_info: unknown option -%c in '%s'\n", a[k], a.c_str());
            usage(stderr);
            return 2;
        }
      }
    } else {
      std::fprintf(stderr, "ucm_info: unknown argument '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const int rc = parse_args(argc, argv, &o); rc >= 0) return rc;
  const bool any = o.version || o.config || o.node || o.bootstrap;
  if (!any && under_launcher()) o.bootstrap = true;
  if (!any && !o.bootstrap) {
    print_version(o);
    if (!o.parsable) std::printf("\n"), usage(stdout);
    return 0;
  }
#if UCM_HAVE_MPI
  int rank = 0, size = 1;
  if (o.bootstrap) {
    // UCM_FANOUT=mpi's thread calls MPI beside this one.
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
#else
  if (o.bootstrap) {
    std::fprintf(stderr, "ucm_info: built without MPI: no bootstrap view (-v, -c, -f and -d work)\n");
    return 2;
  }
  const int rank = 0;
#endif
  int rc = 0;
  if (rank == 0) {
    if (o.version) print_version(o);
    if (o.config) rc |= print_config(o);
    if (o.node) rc |= print_node(o);
    std::fflush(stdout);
  }
#if UCM_HAVE_MPI
  if (o.bootstrap) {
    rc |= bootstrap_view(rank, size);
    MPI_Finalize();
  }
#endif
  return rc;
}
