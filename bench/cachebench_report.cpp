#include "cachebench_report.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace ucm::bench {
namespace {

const Case* find_case(const std::vector<Case>& cs, Layout l, uint32_t keys, int procs, bool v1) {
  for (const Case& c : cs)
    if (c.kind == OpKind::kHit && c.layout == l && c.keys == keys && c.procs == procs && c.v1 == v1) return &c;
  return nullptr;
}

// The one-process line a two-process hit line is compared with (same key count).
const Case* baseline_of(const std::vector<Case>& cs, const Case& c) {
  if (c.kind != OpKind::kHit || c.procs == 1) return nullptr;
  return find_case(cs, Layout::kOne, c.keys, 1, c.v1);
}

const char* verdict(bool ok) { return ok ? "ok" : "MISSED"; }

std::string index_name(const Case& c) { return c.v1 ? "v1_model" : "ucmcache"; }

// The control of an adjacent-slot line: two processes on far slots with as
// many keys. What two busy CPUs cost each other anyway (a shared core or
// cache on the host) shows on both; false sharing only on the adjacent one.
const Case* far_control_of(const std::vector<Case>& cs, const Case& c) {
  if (c.kind != OpKind::kHit || c.layout != Layout::kAdjacent) return nullptr;
  return find_case(cs, Layout::kFar, c.keys, 2, c.v1);
}

// A two-process hit line over its one-process line, by CPU time: a process
// preempted by unrelated work stretches wall time, not the cost of its ops
// (false sharing would stretch both).
double cpu_ratio_to_1proc(const Case& c, const Case& base) { return median(c.runs_cpu) / median(base.runs_cpu); }

void json_array(FILE* f, const std::vector<double>& v) {
  fputc('[', f);
  for (size_t i = 0; i < v.size(); ++i) fprintf(f, "%s%.3f", i ? ", " : "", v[i]);
  fputc(']', f);
}

void json_wake(FILE* f, const WakeResult& w) {
  fprintf(f,
          "    \"%s\": {\"iters\": %d, \"latency_us\": {\"median\": %.3f, \"p90\": %.3f, \"p99\": %.3f, \"max\": %.3f},"
          "\n      \"waiter_cpu_us_per_wait\": {\"median\": %.3f, \"mean\": %.3f, \"max\": %.3f},\n"
          "      \"latency_us_all\": ",
          w.mode, w.iters, median(w.latency_us), percentile(w.latency_us, 0.9), percentile(w.latency_us, 0.99),
          percentile(w.latency_us, 1.0), median(w.cpu_us), mean(w.cpu_us), percentile(w.cpu_us, 1.0));
  json_array(f, w.latency_us);
  fprintf(f, "}");
}

}  // namespace

const Case* v1_twin(const std::vector<Case>& cs, const Case& c) {
  if (c.v1) return nullptr;
  for (const Case& t : cs)
    if (t.v1 && t.kind == c.kind && t.procs == c.procs &&
        (c.kind == OpKind::kHit ? t.layout == c.layout && t.keys == c.keys : t.fill == c.fill))
      return &t;
  return nullptr;
}

double ratio_to_twin(const Case& c, const Case& twin) {
  std::vector<double> r;
  for (size_t i = 0; i < c.runs.size() && i < twin.runs.size(); ++i) r.push_back(c.runs[i] / twin.runs[i]);
  return median(r);
}

double v1_ratio_target(const Case& c) {
  if (c.target <= 0) return 0;
  return c.target / c.anchor_lo;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t idx = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, idx == 0 ? 0 : idx - 1)];
}

double median(const std::vector<double>& v) { return percentile(v, 0.5); }

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

std::string cpu_model() {
  FILE* f = fopen("/proc/cpuinfo", "r");
  if (!f) return "?";
  char line[512];
  std::string model = "?";
  while (fgets(line, sizeof(line), f)) {
    if (strncmp(line, "model name", 10) == 0) {
      const char* p = strchr(line, ':');
      if (p) {
        model = p + 2;
        while (!model.empty() && (model.back() == '\n' || model.back() == ' ')) model.pop_back();
      }
      break;
    }
  }
  fclose(f);
  return model;
}

const char* sched_name() {
  const int p = sched_getscheduler(0);
  return p == SCHED_FIFO ? "fifo" : p == SCHED_RR ? "rr" : "other";
}

void print_header(const RunInfo& info) {
  printf("ucm_cachebench: %s, %ld CPUs online, ranks on CPUs %d and %d, load %.2f, sched %s\n", cpu_model().c_str(),
         sysconf(_SC_NPROCESSORS_ONLN), info.cpus[0], info.cpus[1], info.loadavg, sched_name());
  printf("cache: %u slots x %" PRIu64 " B, max_ranks %u, data %s; %d reps x %" PRIu64 " ms per case%s\n", info.slots,
         info.slot_bytes, info.max_ranks, info.hugetlb ? "hugetlb" : "4 KiB pages", info.reps, info.run_ms,
         info.quick ? " (quick)" : "");
  printf("calibration: one uncontended locked RMW %.1f ns, one clock_gettime(CLOCK_MONOTONIC) %.1f ns\n",
         info.locked_rmw_ns, info.clock_read_ns);
  printf("hit op = get (hit) + release; miss op = get (owner, evicting) + 8-byte fill (unless 'no fill')"
         " + mark_ready + release\n");
  fflush(stdout);
}

void print_ops(const std::vector<Case>& cs) {
  printf("\nGet+Release, ns/op by wall clock (median of %zu runs; min-max of the runs; 2 procs: mean of the two);\n"
         "cpu = the same by CPU time (well below ns/op: the run was preempted, the machine is busy);\n"
         "cpu vs 1p = a two-process line over the one-process line with as many keys, by CPU time;\n"
         "no cliff = an adjacent-slot line over its far-slot control, by CPU time (two busy CPUs slow\n"
         "each other on this host whatever they touch; false sharing shows on adjacent slots only)\n",
         cs.empty() ? size_t{0} : cs[0].runs.size());
  printf("v1 model, v1m = the same op on the model of v1's index (v1_index.h), run right after the line, each rep;\n"
         "/v1m = the median of the per-rep ratios of the line to its v1 model;\n"
         "same-run target = the target over v1's anchor, as a ratio to the v1 model (hit 30/35, miss 80/80)\n");
  printf("%-50s %8s %15s %7s %9s %8s %9s %8s %6s  %s\n", "case", "ns/op", "runs min-max", "cpu", "anchor", "/anchor",
         "cpu vs 1p", "v1 model", "/v1m", "target");
  for (const Case& c : cs) {
    const double m = median(c.runs);
    const double lo = *std::min_element(c.runs.begin(), c.runs.end());
    const double hi = *std::max_element(c.runs.begin(), c.runs.end());
    char anchor[32], range[32], vs1[16] = "";
    if (c.anchor_lo == c.anchor_hi) snprintf(anchor, sizeof(anchor), "%.0f", c.anchor_lo);
    else snprintf(anchor, sizeof(anchor), "%.0f-%.0f", c.anchor_lo, c.anchor_hi);
    snprintf(range, sizeof(range), "%.1f-%.1f", lo, hi);
    const Case* base = baseline_of(cs, c);
    if (base) snprintf(vs1, sizeof(vs1), "%.2fx", cpu_ratio_to_1proc(c, *base));
    const Case* twin = v1_twin(cs, c);
    char v1m[16] = "", v1r[16] = "";
    if (twin) {
      snprintf(v1m, sizeof(v1m), "%.1f", median(twin->runs));
      snprintf(v1r, sizeof(v1r), "%.2fx", ratio_to_twin(c, *twin));
    }
    char target[96] = "";
    if (c.target > 0 && !c.v1) {
      int n = snprintf(target, sizeof(target), "<= %.0f: %s", c.target, verdict(m <= c.target));
      if (twin)
        snprintf(target + n, sizeof(target) - static_cast<size_t>(n), "; same run <= %.2fx v1m: %s",
                 v1_ratio_target(c), verdict(ratio_to_twin(c, *twin) <= v1_ratio_target(c)));
    } else if (base && c.layout == Layout::kAdjacent && !c.v1) {
      // Against the far-slot control when it ran, else against one process.
      const Case* far = far_control_of(cs, c);
      const double r = far ? median(c.runs_cpu) / median(far->runs_cpu) : cpu_ratio_to_1proc(c, *base);
      snprintf(target, sizeof(target), "no cliff (<= %.2fx %s): %.2fx %s", kTargetNoCliff, far ? "far slots" : "1 proc",
               r, verdict(r <= kTargetNoCliff));
    }
    printf("%-50s %8.1f %15s %7.1f %9s %7.2fx %9s %8s %6s  %s\n", c.name.c_str(), m, range, median(c.runs_cpu),
           anchor, m / c.anchor_lo, vs1, v1m, v1r, target);
  }
}

void print_wake(const WakeResult& futex, const WakeResult& poll) {
  printf("\nWake latency (mark_ready -> waiter running), waiter CPU per wait\n");
  printf("%-6s %6s %11s %11s %11s %14s %14s\n", "mode", "iters", "median us", "p90 us", "p99 us", "cpu med us",
         "cpu mean us");
  for (const WakeResult* w : {&futex, &poll})
    printf("%-6s %6d %11.1f %11.1f %11.1f %14.2f %14.2f\n", w->mode, w->iters, median(w->latency_us),
           percentile(w->latency_us, 0.9), percentile(w->latency_us, 0.99), median(w->cpu_us), mean(w->cpu_us));
  const double ratio = median(poll.latency_us) / median(futex.latency_us);
  printf("poll/futex median latency: %.0fx (target >= %.0fx: %s)\n", ratio, kTargetWakeRatio,
         verdict(ratio >= kTargetWakeRatio));
}

bool write_json(const std::string& path, const RunInfo& info, const std::vector<Case>& cs, const WakeResult* futex,
                const WakeResult* poll) {
  FILE* f = fopen(path.c_str(), "w");
  if (!f) {
    perror(path.c_str());
    return false;
  }
  fprintf(f, "{\n  \"benchmark\": \"ucm_cachebench\",\n");
  fprintf(f,
          "  \"machine\": {\"cpu_model\": \"%s\", \"nproc\": %ld, \"cpus_used\": [%d, %d], \"loadavg_1m\": %.2f, "
          "\"sched\": \"%s\",\n              \"locked_rmw_ns\": %.2f, \"clock_read_ns\": %.2f},\n",
          cpu_model().c_str(), sysconf(_SC_NPROCESSORS_ONLN), info.cpus[0], info.cpus[1], info.loadavg, sched_name(),
          info.locked_rmw_ns, info.clock_read_ns);
  fprintf(f,
          "  \"config\": {\"quick\": %s, \"reps\": %d, \"run_ms\": %" PRIu64 ", \"slots\": %u, \"slot_bytes\": %" PRIu64
          ", \"max_ranks\": %u, \"hugetlb\": %s, \"ndebug\": %s},\n",
          info.quick ? "true" : "false", info.reps, info.run_ms, info.slots, info.slot_bytes, info.max_ranks,
          info.hugetlb ? "true" : "false",
#ifdef NDEBUG
          "true"
#else
          "false"
#endif
  );
  fprintf(f, "  \"get_release\": [\n");
  for (size_t i = 0; i < cs.size(); ++i) {
    const Case& c = cs[i];
    const Case* base = baseline_of(cs, c);
    const Case* twin = v1_twin(cs, c);
    const Case* far = far_control_of(cs, c);
    const double m = median(c.runs);
    fprintf(f,
            "    {\"case\": \"%s\", \"index\": \"%s\", \"op\": \"%s\", \"procs\": %d, \"keys_per_proc\": %u, \"evict\": \"%s\", "
            "\"fill_bytes\": %d,\n     \"ns_per_op_median\": %.3f, \"ns_per_op_slowest_proc_median\": %.3f, "
            "\"cpu_ns_per_op_median\": %.3f,\n     \"anchor_ns\": [%.0f, %.0f], \"ratio_to_anchor\": %.3f, "
            "\"ratio_to_1proc\": %.3f, \"cpu_ratio_to_1proc\": %.3f, \"target_ns\": %.0f,",
            c.name.c_str(), index_name(c).c_str(), c.kind == OpKind::kHit ? "hit" : "miss", c.procs, c.keys,
            c.evict == EvictMode::kClock ? "clock" : "ring", c.kind == OpKind::kMiss && c.fill ? 8 : 0, m,
            median(c.runs_max), median(c.runs_cpu), c.anchor_lo, c.anchor_hi, m / c.anchor_lo,
            base ? m / median(base->runs) : 1.0, base ? cpu_ratio_to_1proc(c, *base) : 1.0, c.target);
    if (far) fprintf(f, "\n     \"cpu_ratio_to_far_slots\": %.3f,", median(c.runs_cpu) / median(far->runs_cpu));
    if (twin)
      fprintf(f, "\n     \"v1_model_ns_median\": %.3f, \"ratio_to_v1_model\": %.3f, \"same_run_target_ratio\": %.3f,",
              median(twin->runs), ratio_to_twin(c, *twin), v1_ratio_target(c));
    fprintf(f, " \"runs\": ");
    json_array(f, c.runs);
    fprintf(f, "}%s\n", i + 1 < cs.size() ? "," : "");
  }
  fprintf(f, "  ]");
  if (futex && poll) {
    fprintf(f, ",\n  \"wake\": {\n");
    json_wake(f, *futex);
    fprintf(f, ",\n");
    json_wake(f, *poll);
    fprintf(f, ",\n    \"poll_over_futex_median\": %.2f, \"target_ratio\": %.0f\n  }",
            median(poll->latency_us) / median(futex->latency_us), kTargetWakeRatio);
  }
  fprintf(f, "\n}\n");
  return fclose(f) == 0;
}

}  // namespace ucm::bench
