// Argument text for the record (see arg_text.h).

#include "opdump/cpp/rows/arg_text.h"

#include <charconv>
#include <cmath>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include <c10/util/SmallVector.h>

namespace opdump {
namespace {

// Doubles as Python prints them: the shortest text that reads back the same.
void append_double(std::string& out, double d) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  std::string_view text(buf, ec == std::errc() ? end - buf : 0);
  out += text;
  if (std::isfinite(d) && text.find_first_of(".e") == std::string_view::npos) out += ".0";
}

// Text of values whose printing through an ostream is the slow path; the
// output is the same as `operator<<` gives.
bool append_plain(std::string& out, const c10::IValue& v) {
  char buf[24];
  if (v.isInt()) {
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v.toInt());
    out.append(buf, ec == std::errc() ? end - buf : 0);
  } else if (v.isBool()) {
    out += v.toBool() ? "True" : "False";
  } else if (v.isNone()) {
    out += "None";
  } else if (v.isDouble()) {
    append_double(out, v.toDouble());
  } else if (v.isIntList()) {
    out += '[';
    bool first = true;
    for (int64_t x : v.toIntList()) {
      if (!first) out += ", ";
      first = false;
      auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
      out.append(buf, ec == std::errc() ? end - buf : 0);
    }
    out += ']';
  } else {
    return false;
  }
  return true;
}

// The text `operator<<` gives, through one stream per thread:
// constructing an ostringstream per value costs more than the rest of the
// record.
std::string streamed(const c10::IValue& v, const c10::Type* type) {
  thread_local std::ostringstream s;
  s.str(std::string());
  s.clear();
  if (v.isInt() && type->kind() == c10::TypeKind::MemoryFormatType)
    s << static_cast<c10::MemoryFormat>(v.toInt());
  else if (v.isInt() && type->kind() == c10::TypeKind::LayoutType)
    s << static_cast<c10::Layout>(v.toInt());
  else
    s << v;
  return s.str();
}

}  // namespace

void append_arg_text(std::string& out, const c10::Argument& arg, const c10::IValue& v) {
  if (!out.empty()) out += ", ";
  out += arg.name();
  out += '=';
  // A plain pointer: copying the TypePtr is two atomic operations a value.
  const c10::Type* type = arg.real_type().get();
  if (type->kind() == c10::TypeKind::OptionalType)
    type = type->expectRef<c10::OptionalType>().getElementType().get();
  if (v.isInt() && type->kind() == c10::TypeKind::ScalarTypeType) {
    out += c10::getDtypeNames(static_cast<c10::ScalarType>(v.toInt())).first;
    return;
  }
  if (v.isGenerator()) {
    out += "<generator>";
    return;
  }
  const bool enum_int = v.isInt() && (type->kind() == c10::TypeKind::MemoryFormatType ||
                                      type->kind() == c10::TypeKind::LayoutType);
  if (!enum_int && append_plain(out, v)) return;
  // Layouts, memory formats and devices: few values, each printed through
  // the stream once per thread (every `empty` names its layout and device).
  if (enum_int || v.isDevice()) {
    const int64_t key = v.isDevice() ? (int64_t{1} << 40) | (static_cast<int64_t>(v.toDevice().type()) << 8) |
                                           static_cast<uint8_t>(v.toDevice().index())
                                     : (static_cast<int64_t>(type->kind()) << 32) | (v.toInt() & 0xffffffff);
    thread_local c10::SmallVector<std::pair<int64_t, std::string>, 8> known;
    for (const auto& [k, text] : known)
      if (k == key) {
        out += text;
        return;
      }
    std::string text = streamed(v, type);
    out += text;
    if (known.size() < 64) known.emplace_back(key, std::move(text));
    return;
  }
  out += streamed(v, type);
}

}  // namespace opdump
