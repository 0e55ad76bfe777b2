// The host copy engine: memcpy. Nothing to register.
#include "device/host_engine.h"

namespace ucm {

namespace {
class HostEngine final : public CopyEngine {
 public:
  explicit HostEngine(int id) : id_(id) {}
  const char* name() const override { return "host"; }
  int device_id() const override { return id_; }
  uint64_t alignment() const override { return 64; }
  Result register_host(void*, uint64_t) override { return Result::kOk; }
  void unregister_host(void*) override {}
  std::string pci_bus_id() const override { return {}; }

 private:
  int id_;
};
}  // namespace

std::unique_ptr<CopyEngine> make_host_engine(int device_id) { return std::make_unique<HostEngine>(device_id); }

}  // namespace ucm
