// The host copy engine: host_copy (memcpy, or its vector loop between
// mutually misaligned buffers: host_copy.h). Nothing to register.
#include "device/host_engine.h"

#include "device/host_copy.h"

namespace ucm {

namespace {

// The copy at submission: every ticket is done as soon as it is handed out.
class HostStream final : public CopyStream {
 public:
  Result copy(void* dst, const void* src, uint64_t bytes, uint64_t* ticket) override {
    host_copy(dst, src, bytes);
    *ticket = ++last_;
    return Result::kOk;
  }
  Result flush() override { return Result::kOk; }
  bool done(uint64_t) override { return true; }
  Result wait(uint64_t) override { return Result::kOk; }

 private:
  uint64_t last_ = 0;
};

class MemoryEngine final : public CopyEngine {
 public:
  MemoryEngine(const char* name, int id, std::function<std::unique_ptr<CopyStream>()> open)
      : name_(name), id_(id), open_(std::move(open)) {}
  const char* name() const override { return name_; }
  int device_id() const override { return id_; }
  uint64_t alignment() const override { return 64; }
  Result register_host(void*, uint64_t) override { return Result::kOk; }
  void unregister_host(void*) override {}
  std::string pci_bus_id() const override { return {}; }
  bool checks_app_buffers() const override { return false; }  // host memory: nothing to tell
  Result open_stream(std::unique_ptr<CopyStream>* out) override {
    *out = open_();
    return Result::kOk;
  }

 private:
  const char* name_;
  int id_;
  std::function<std::unique_ptr<CopyStream>()> open_;
};
}  // namespace

std::unique_ptr<CopyEngine> make_memory_engine(const char* name, int device_id,
                                               std::function<std::unique_ptr<CopyStream>()> open) {
  return std::make_unique<MemoryEngine>(name, device_id, std::move(open));
}

std::unique_ptr<CopyEngine> make_host_engine(int device_id) {
  return make_memory_engine("host", device_id, [] { return std::make_unique<HostStream>(); });
}

}  // namespace ucm
