// A table from pointers to values, for the per-op caches a thread keeps
// (fallback.cpp's op facts). Its keys are in one array, open addressing,
// so a lookup reads one or two cache lines of keys; std::unordered_map
// chased a node of its own per lookup, a cache miss on most op calls of a
// large model (the largest part of the hook's own time with nothing
// selected). Entries are never removed: a key is an operator's entry,
// which the caller checks against the op it now holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace opdump {

template <typename T>
class PointerTable {
 public:
  // The value for `key` (not null), default-made at its first lookup. A
  // reference stays valid as the table grows: values live in a deque.
  T& operator[](const void* key) {
    if (slots_.empty()) rehash(64);
    for (size_t i = index(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == key) return *s.value;
      if (s.key != nullptr) continue;
      if (2 * (values_.size() + 1) > slots_.size()) {
        rehash(2 * slots_.size());
        return (*this)[key];
      }
      values_.emplace_back();
      s = Slot{key, &values_.back()};
      return values_.back();
    }
  }

 private:
  struct Slot {
    const void* key = nullptr;
    T* value = nullptr;
  };

  // Fibonacci hashing: the top bits of the key times 2^64 / phi.
  size_t index(const void* key) const {
    return static_cast<size_t>((static_cast<uint64_t>(reinterpret_cast<uintptr_t>(key)) * 0x9E3779B97F4A7C15ull) >>
                               shift_);
  }

  // `n`: a power of two.
  void rehash(size_t n) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(n, Slot{});
    mask_ = n - 1;
    shift_ = 64 - __builtin_ctzll(static_cast<unsigned long long>(n));
    for (const Slot& s : old) {
      if (s.key == nullptr) continue;
      size_t i = index(s.key);
      while (slots_[i].key != nullptr) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  std::deque<T> values_;
  size_t mask_ = 0;
  int shift_ = 64;
};

}  // namespace opdump
