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

#include "opdump/cpp/rows/rows.h"

namespace opdump {

uint32_t name_id(std::string_view name) { return intern_name(rust::Str(name.data(), name.size())); }

namespace {

// The id in `slot`, asked for once: slots hold the id plus one, so that 0
// means "not asked yet"; a failed ask (u32::MAX) is not kept.
template <typename Name>
uint32_t cached(std::atomic<uint32_t>& slot, Name name) {
  uint32_t id = slot.load(std::memory_order_acquire);
  if (id == 0) {
    id = name_id(name()) + 1;
    if (id != 0) slot.store(id, std::memory_order_release);
  }
  return id - 1;
}

}  // namespace

uint32_t dtype_name_id(at::ScalarType t) {
  static std::array<std::atomic<uint32_t>, static_cast<size_t>(at::ScalarType::NumOptions)> ids{};
  // The name Python prints without "torch.": float32, bfloat16, int64.
  auto name = [t] { return c10::getDtypeNames(t).first; };
  const auto i = static_cast<size_t>(t);
  return i < ids.size() ? cached(ids[i], name) : name_id(name());
}

uint32_t device_name_id(const at::Device& d) {
  if (d.is_cpu()) {
    static const uint32_t cpu = name_id("cpu");
    return cpu;
  }
  // A handful of devices per thread: a short list beats a map.
  thread_local std::vector<std::pair<at::Device, uint32_t>> seen;
  for (const auto& [device, id] : seen)
    if (device == d) return id;
  const uint32_t id = name_id(d.str());
  seen.emplace_back(d, id);
  return id;
}

uint32_t return_name_id(size_t r) {
  static std::array<std::atomic<uint32_t>, 16> ids{};
  auto name = [r] { return std::to_string(r); };
  return r < ids.size() ? cached(ids[r], name) : name_id(name());
}

const OpNames& op_names(const c10::OperatorHandle& op) {
  // Keyed by the operator's entry, which lives as long as the op is
  // registered. An op deregistered and another registered at the same
  // address is told apart by its name, overload and argument count.
  thread_local std::unordered_map<const void*, OpNames> cache;
  const auto& name = op.operator_name();
  const auto& args = op.schema().arguments();
  OpNames& n = cache[&name];
  if (n.args.size() != args.size() || n.name != name.name || n.overload != name.overload_name) {
    n.name = name.name;
    n.overload = name.overload_name;
    n.op = name_id(name.name);
    n.overload_id = name_id(name.overload_name.empty() ? "default" : name.overload_name);
    n.args.clear();
    for (const auto& a : args) n.args.push_back(name_id(a.name()));
  }
  return n;
}

}  // namespace opdump
