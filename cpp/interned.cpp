// Ids of the names a record carries (an op, its overload, its arguments, a
// dtype, a device), asked of Rust (crates/engine/src/names.rs) once per
// distinct name and cached here, so that a record carries numbers, not
// strings: no allocation per row on the job's thread, and none to free on
// the writer's.

#include <array>
#include <atomic>
#include <string>
#include <unordered_map>
#include <utility>

#include "opdump/cpp/internal.h"

namespace opdump {

namespace {

// Cached ids are stored plus one: 0 is "not asked yet".
constexpr uint32_t kUnset = 0;

uint32_t ask(std::string_view name) { return intern_name(rust::Str(name.data(), name.size())); }

}  // namespace

uint32_t name_id(std::string_view name) { return ask(name); }

uint32_t dtype_name_id(at::ScalarType t) {
  static std::array<std::atomic<uint32_t>, static_cast<size_t>(at::ScalarType::NumOptions)> ids{};
  const auto i = static_cast<size_t>(t);
  if (i >= ids.size()) return ask(c10::getDtypeNames(t).first);
  uint32_t id = ids[i].load(std::memory_order_acquire);
  if (id == kUnset) {
    // The name Python prints without "torch.": float32, bfloat16, int64.
    id = ask(c10::getDtypeNames(t).first) + 1;
    if (id != kUnset) ids[i].store(id, std::memory_order_release);  // u32::MAX + 1 is not kept
  }
  return id - 1;
}

uint32_t device_name_id(const at::Device& d) {
  if (d.is_cpu()) {
    static const uint32_t cpu = ask("cpu");
    return cpu;
  }
  // A handful of devices per thread: a short list beats a map.
  thread_local std::vector<std::pair<at::Device, uint32_t>> seen;
  for (const auto& [device, id] : seen)
    if (device == d) return id;
  const uint32_t id = ask(d.str());
  seen.emplace_back(d, id);
  return id;
}

uint32_t return_name_id(size_t r) {
  thread_local std::array<uint32_t, 16> ids{};
  if (r >= ids.size()) return ask(std::to_string(r));
  if (ids[r] == kUnset) ids[r] = ask(std::to_string(r)) + 1;
  return ids[r] - 1;
}

const OpNames& op_names(const c10::OperatorHandle& op) {
  // Keyed by the operator's entry, which lives as long as the op is
  // registered. An op deregistered and another registered at the same
  // address is told apart by its name and argument count.
  thread_local std::unordered_map<const void*, OpNames> cache;
  const auto& name = op.operator_name();
  const auto& args = op.schema().arguments();
  OpNames& n = cache[&name];
  if (n.args.size() != args.size() || n.name != name.name || n.overload != name.overload_name) {
    n.name = name.name;
    n.overload = name.overload_name;
    n.op = ask(name.name);
    n.overload_id = ask(name.overload_name.empty() ? "default" : name.overload_name);
    n.args.clear();
    for (const auto& a : args) n.args.push_back(ask(a.name()));
  }
  return n;
}

}  // namespace opdump
