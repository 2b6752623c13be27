// The full tensors and the typed arguments of a call OPDUMP_CAPTURE chose,
// read off the dispatcher's stack, for `opdump repro` to call the op again.
//
// - Inputs are copied before the op runs (an in-place op changes them),
//   outputs after; each to the host, in its own dtype and logical shape,
//   its values in row-major order. Copying a device tensor waits for the
//   device: acceptable for the few calls chosen, never done for others.
// - Every argument, in schema order, goes into one JSON array with its type
//   (crates/format/src/capture.rs describes the form); tensors appear there
//   by their key in the capture file.
// - The bytes are taken from the process's budget (OPDUMP_CAPTURE_MAX_BYTES)
//   before anything is copied: inputs that do not fit make no capture,
//   outputs that do not fit are left out.
//
// The copies run with opdump's own keys excluded (stats_excluded_keys), so
// that neither opdump, autograd nor a user's mode sees them.

#include <array>
#include <charconv>
#include <cstdio>
#include <sstream>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "opdump/cpp/common/common.h"
#include "opdump/cpp/rows/rows.h"
#include "opdump/cpp/stats/stats.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

namespace {

void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

void json_int(std::string& out, int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, ec == std::errc() ? end - buf : 0);
}

// The shortest text that reads back the same double; JSON has no NaN or
// infinity, so those are strings.
void json_double(std::string& out, double d) {
  if (std::isnan(d)) {
    out += "\"nan\"";
  } else if (std::isinf(d)) {
    out += d > 0 ? "\"inf\"" : "\"-inf\"";
  } else {
    char buf[32];
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
    out.append(buf, ec == std::errc() ? end - buf : 0);
  }
}

// The key of a tensor in the capture file (crates/format/src/capture.rs).
std::string key_of(const char* role, std::string_view arg, int64_t list_index) {
  std::string k(role);
  k += '.';
  k.append(arg);
  if (list_index >= 0) {
    k += '.';
    json_int(k, list_index);
  }
  return k;
}

c10::TypeKind element_kind(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::OptionalType) return t->expectRef<c10::OptionalType>().getElementType()->kind();
  return t->kind();
}

const char* layout_name(c10::Layout l) {
  switch (l) {
    case c10::kStrided:
      return "strided";
    case c10::kSparse:
      return "sparse_coo";
    case c10::kSparseCsr:
      return "sparse_csr";
    case c10::kSparseCsc:
      return "sparse_csc";
    case c10::kSparseBsr:
      return "sparse_bsr";
    case c10::kSparseBsc:
      return "sparse_bsc";
    case c10::kMkldnn:
      return "_mkldnn";
    case c10::kJagged:
      return "jagged";
    default:
      return nullptr;
  }
}

const char* memory_format_name(c10::MemoryFormat m) {
  switch (m) {
    case c10::MemoryFormat::Contiguous:
      return "contiguous_format";
    case c10::MemoryFormat::ChannelsLast:
      return "channels_last";
    case c10::MemoryFormat::ChannelsLast3d:
      return "channels_last_3d";
    case c10::MemoryFormat::Preserve:
      return "preserve_format";
    default:
      return nullptr;
  }
}

// Tensor[] or Tensor?[].
bool is_tensor_list_type(const c10::Argument& a) {
  auto t = a.real_type();
  if (t->kind() == c10::TypeKind::OptionalType) t = t->expectRef<c10::OptionalType>().getElementType();
  if (t->kind() != c10::TypeKind::ListType) return false;
  auto el = t->expectRef<c10::ListType>().getElementType();
  if (el->kind() == c10::TypeKind::OptionalType) el = el->expectRef<c10::OptionalType>().getElementType();
  return el->kind() == c10::TypeKind::TensorType;
}

// A tensor opdump can copy to the host as plain values.
bool savable(const at::Tensor& t) { return t.defined() && !values_unreadable(t); }

int64_t bytes_of(const at::Tensor& t) { return savable(t) ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

// Copies `t` to the host and hands its bytes to Rust under `key`.
void save(OpCall& call, const at::Tensor& t, const std::string& key) {
  if (!savable(t)) return;
  at::Tensor x = t;
  if (x.is_conj()) x = x.resolve_conj();
  if (x.is_neg()) x = x.resolve_neg();
  if (!x.device().is_cpu()) x = x.to(at::kCPU);  // waits for the device
  x = x.contiguous();
  SavedTensor s{};
  s.key = rust::String(key);
  s.dtype = rust::String(std::string(c10::getDtypeNames(x.scalar_type()).first));
  for (const int64_t d : x.sizes()) s.shape.push_back(d);
  const auto* p = static_cast<const uint8_t*>(x.const_data_ptr());
  s.data = capture_bytes(rust::Slice<const uint8_t>(p, x.nbytes()));
  call.saved.push_back(std::move(s));
}

// `{"tag": <what emit writes>}`.
template <typename F>
void tagged(std::string& out, const char* tag, F&& emit) {
  out += "{\"";
  out += tag;
  out += "\": ";
  emit();
  out += '}';
}

void tagged_string(std::string& out, const char* tag, std::string_view s) {
  tagged(out, tag, [&] { json_string(out, s); });
}

// `[e0, e1, ...]`, each element written by emit(element).
template <typename List, typename F>
void json_array(std::string& out, const List& list, F&& emit) {
  out += '[';
  bool first = true;
  for (const auto& e : list) {
    if (!first) out += ", ";
    first = false;
    emit(e);
  }
  out += ']';
}

void unsupported(std::string& out, const c10::IValue& v) {
  std::ostringstream s;
  s << v;
  tagged_string(out, "unsupported", s.str());
}

// A value whose runtime type says what it is: None, int (or a concrete
// SymInt), float, bool. False for anything else.
bool json_plain(std::string& out, const c10::IValue& v) {
  if (v.isNone()) {
    out += "null";
  } else if (v.isInt()) {
    tagged(out, "int", [&] { json_int(out, v.toInt()); });
  } else if (v.isSymInt() && !v.toSymInt().is_heap_allocated()) {
    tagged(out, "int", [&] { json_int(out, v.toSymInt().as_int_unchecked()); });
  } else if (v.isDouble()) {
    tagged(out, "float", [&] { json_double(out, v.toDouble()); });
  } else if (v.isBool()) {
    out += v.toBool() ? "{\"bool\": true}" : "{\"bool\": false}";
  } else {
    return false;
  }
  return true;
}

// One argument's value, typed, as JSON (see crates/format/src/capture.rs).
// The schema's type tells an int that is a dtype, a layout or a memory
// format from a plain int; everything else goes by its runtime type.
void json_value(std::string& out, const c10::Argument& a, const c10::IValue& v, const std::string& key) {
  if (v.isTensor()) {
    if (v.toTensor().defined())
      tagged_string(out, "tensor", key);
    else
      out += "null";
  } else if (v.isTensorList() || (v.isList() && is_tensor_list_type(a))) {
    // Element j is `key.j`; an undefined or None element is null.
    std::vector<bool> defined;
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) defined.push_back(t.defined());
    } else {
      for (const auto& e : v.toListRef()) defined.push_back(e.isTensor() && e.toTensor().defined());
    }
    int64_t j = 0;
    tagged(out, "tensors", [&] {
      json_array(out, defined, [&](bool d) {
        if (d) {
          std::string k = key;
          k += '.';
          json_int(k, j);
          json_string(out, k);
        } else {
          out += "null";
        }
        ++j;
      });
    });
  } else if (v.isInt() && element_kind(a.real_type()) == c10::TypeKind::ScalarTypeType) {
    tagged_string(out, "dtype", c10::getDtypeNames(static_cast<c10::ScalarType>(v.toInt())).first);
  } else if (const char* l = v.isInt() && element_kind(a.real_type()) == c10::TypeKind::LayoutType
                                 ? layout_name(static_cast<c10::Layout>(v.toInt()))
                                 : nullptr) {
    tagged_string(out, "layout", l);
  } else if (const char* m = v.isInt() && element_kind(a.real_type()) == c10::TypeKind::MemoryFormatType
                                 ? memory_format_name(static_cast<c10::MemoryFormat>(v.toInt()))
                                 : nullptr) {
    tagged_string(out, "memory_format", m);
  } else if (json_plain(out, v)) {
  } else if (v.isComplexDouble()) {
    const auto c = v.toComplexDouble();
    tagged(out, "complex", [&] {
      json_array(out, std::array<double, 2>{c.real(), c.imag()}, [&](double x) { json_double(out, x); });
    });
  } else if (v.isString()) {
    tagged_string(out, "str", v.toStringRef());
  } else if (v.isDevice()) {
    tagged_string(out, "device", v.toDevice().str());
  } else if (v.isGenerator()) {
    out += "{\"generator\": null}";
  } else if (v.isIntList()) {
    tagged(out, "ints", [&] { json_array(out, v.toIntList(), [&](int64_t x) { json_int(out, x); }); });
  } else if (v.isDoubleList()) {
    tagged(out, "floats", [&] { json_array(out, v.toDoubleList(), [&](double x) { json_double(out, x); }); });
  } else if (v.isBoolList()) {
    tagged(out, "bools", [&] { json_array(out, v.toBoolList(), [&](bool x) { out += x ? "true" : "false"; }); });
  } else if (v.isList()) {
    // A list of other values (SymInt[], int?[]): each element by its own
    // runtime type.
    tagged(out, "list", [&] {
      json_array(out, v.toListRef(), [&](const c10::IValue& e) {
        if (!json_plain(out, e)) unsupported(out, e);
      });
    });
  } else {
    unsupported(out, v);
  }
}

}  // namespace

void save_inputs(OpCall& call, const c10::FunctionSchema& schema, const torch::jit::Stack& stack, bool budgeted) {
  const auto& args = schema.arguments();
  const size_t first = stack.size() - args.size();
  int64_t bytes = 0;
  for (size_t i = 0; i < args.size(); ++i)
    for_each_tensor_indexed(stack[first + i], [&](const at::Tensor& t, int64_t) { bytes += bytes_of(t); });
  if (budgeted && !capture_reserve(static_cast<uint64_t>(bytes), false)) return;
  c10::impl::ExcludeDispatchKeyGuard unseen(stats_excluded_keys());
  std::string json = "[";
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    const c10::IValue& v = stack[first + i];
    const std::string key = key_of("input", a.name(), -1);
    for_each_tensor_indexed(v, [&](const at::Tensor& t, int64_t j) { save(call, t, key_of("input", a.name(), j)); });
    if (i > 0) json += ", ";
    json += "{\"name\": ";
    json_string(json, a.name());
    json += a.kwarg_only() ? ", \"kwarg_only\": true, \"value\": " : ", \"kwarg_only\": false, \"value\": ";
    json_value(json, a, v, key);
    json += '}';
  }
  json += ']';
  call.capture_args = rust::String(json);
  call.captured = true;
}

void save_outputs(OpCall& call, const c10::FunctionSchema& schema, const torch::jit::Stack& stack,
                  const std::vector<std::pair<std::string, c10::IValue>>& written, bool budgeted) {
  const auto& returns = schema.returns();
  std::vector<std::pair<std::string, const c10::IValue*>> outs;
  if (!returns.empty()) {
    const size_t first = stack.size() - returns.size();
    for (size_t r = 0; r < returns.size(); ++r) outs.emplace_back(std::to_string(r), &stack[first + r]);
  } else {
    for (const auto& [name, v] : written) outs.emplace_back(name, &v);
  }
  int64_t bytes = 0;
  for (const auto& [name, v] : outs)
    for_each_tensor_indexed(*v, [&](const at::Tensor& t, int64_t) { bytes += bytes_of(t); });
  if (budgeted && !capture_reserve(static_cast<uint64_t>(bytes), true)) {
    call.capture_outputs_skipped = true;
    return;
  }
  c10::impl::ExcludeDispatchKeyGuard unseen(stats_excluded_keys());
  for (const auto& [name, v] : outs)
    for_each_tensor_indexed(*v, [&](const at::Tensor& t, int64_t j) { save(call, t, key_of("output", name, j)); });
}

}  // namespace opdump
