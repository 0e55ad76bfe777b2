// SmallBuffer<T, N>: n elements of T, on the stack when n <= N, else one heap
// allocation. For per-call scratch arrays on paths that should not allocate
// in the common case (a task's entries: submit checks, the inline path).
// T must be trivially copyable; the elements are left uninitialized.
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>

namespace ucm {

template <typename T, size_t N>
class SmallBuffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  explicit SmallBuffer(size_t n) : data_(n <= N ? local_ : (heap_ = std::make_unique<T[]>(n)).get()) {}
  SmallBuffer(const SmallBuffer&) = delete;
  SmallBuffer& operator=(const SmallBuffer&) = delete;
  T* data() { return data_; }
  T& operator[](size_t i) { return data_[i]; }

 private:
  T local_[N];
  std::unique_ptr<T[]> heap_;
  T* data_;
};

}  // namespace ucm
