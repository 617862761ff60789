// The strict field reader (json_fields.h).
#include "common/json_fields.h"

#include <charconv>
#include <cmath>

namespace ferry::json {
namespace {

// Longest piece of a peer's text (a member name, an offending value) quoted back in a refusal.
constexpr size_t kMaxQuoted = 64;

// A number for a range in a refusal: integral values without a fraction ("0", "1000000000").
std::string boundText(double d) {
  if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e15) {
    return std::to_string(static_cast<int64_t>(d));
  }
  return serialize(Value(d));
}

std::string offending(const Value& v) { return serialize(v).substr(0, kMaxQuoted); }

std::string notAnInteger(int64_t lo, int64_t hi, const Value& v) {
  return "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not " +
         offending(v);
}

}  // namespace

Status Fields::refuse(const std::string& what) const { return errors_.refuse(what); }

Status Fields::refuse(std::string_view key, const std::string& problem) const {
  std::string name;
  key = key.substr(0, kMaxQuoted);
  if (errors_.names == FieldErrors::Names::kFieldWord) {
    // A peer's member name may hold anything: keep the refusal one printable line.
    name = "field '";
    for (char c : key) name += (c >= 0x20 && c < 0x7f && c != '\'') ? c : '?';
    name += '\'';
  } else {
    name = serialize(Value(key));
  }
  return refuse(name + " " + problem);
}

Status Fields::only(std::initializer_list<std::string_view> allowed) const {
  const Object* members = v_.object();
  if (members == nullptr) return refuse("not a JSON object");
  for (const auto& [key, value] : *members) {
    bool ok = false;
    for (std::string_view a : allowed) ok = ok || key == a;
    if (!ok) return refuse(key, "is an unknown member");
  }
  return Status::ok();
}

Result<std::string> Fields::text(std::string_view key, size_t maxLength) const {
  const Value* v = v_.find(key);
  if (v == nullptr) return refuse(key, "is missing");
  auto s = v->getString();
  if (!s.isOk()) return refuse(key, "must be a string");
  if (s->size() > maxLength) return refuse(key, "is longer than " + std::to_string(maxLength));
  return std::string(*s);
}

Result<int64_t> Fields::integer(std::string_view key, int64_t lo, int64_t hi) const {
  const Value* v = v_.find(key);
  if (v == nullptr) return refuse(key, "is missing");
  auto i = v->getInt();
  if (!i.isOk() || *i < lo || *i > hi) return refuse(key, notAnInteger(lo, hi, *v));
  return *i;
}

Result<int64_t> Fields::decimal(std::string_view key, int64_t lo, int64_t hi) const {
  const Value* v = v_.find(key);
  if (v == nullptr || !v->isString()) return integer(key, lo, hi);
  std::string_view s = *v->getString();
  int64_t i = 0;
  // from_chars takes exactly an optional '-' and decimal digits: no '+', space or fraction.
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
  if (ec != std::errc() || end != s.data() + s.size() || i < lo || i > hi) {
    return refuse(key, notAnInteger(lo, hi, *v));
  }
  return i;
}

Result<double> Fields::number(std::string_view key, double lo, double hi) const {
  const Value* v = v_.find(key);
  if (v == nullptr) return refuse(key, "is missing");
  auto d = v->getDouble();
  if (!d.isOk() || !std::isfinite(*d) || *d < lo || *d > hi) {
    return refuse(key,
                  "must be a number in [" + boundText(lo) + ", " + boundText(hi) + "], not " + offending(*v));
  }
  return *d;
}

Result<bool> Fields::boolean(std::string_view key) const {
  const Value* v = v_.find(key);
  if (v == nullptr) return refuse(key, "is missing");
  auto b = v->getBool();
  if (!b.isOk()) return refuse(key, "must be true or false");
  return *b;
}

Result<const Array*> Fields::array(std::string_view key, size_t maxItems) const {
  const Value* v = v_.find(key);
  if (v == nullptr) return refuse(key, "is missing");
  const Array* a = v->array();
  if (a == nullptr) return refuse(key, "must be an array");
  if (a->size() > maxItems) return refuse(key, "has more than " + std::to_string(maxItems) + " elements");
  return a;
}

Result<const Array*> Fields::exactArray(std::string_view key, size_t count) const {
  const Value* v = v_.find(key);
  if (v == nullptr) return refuse(key, "is missing");
  const Array* a = v->array();
  if (a == nullptr) return refuse(key, "must be an array");
  if (a->size() != count) {
    return refuse(key, "must have " + std::to_string(count) + " elements, not " + std::to_string(a->size()));
  }
  return a;
}

Result<const Value*> Fields::object(std::string_view key) const {
  const Value* v = v_.find(key);
  if (v == nullptr) return refuse(key, "is missing");
  if (!v->isObject()) return refuse(key, "must be an object");
  return v;
}

Result<std::string> Fields::textOr(std::string_view key, size_t maxLength, std::string fallback) const {
  if (!has(key)) return fallback;
  return text(key, maxLength);
}

Result<int64_t> Fields::integerOr(std::string_view key, int64_t lo, int64_t hi, int64_t fallback) const {
  if (!has(key)) return fallback;
  return integer(key, lo, hi);
}

Result<int64_t> Fields::decimalOr(std::string_view key, int64_t lo, int64_t hi, int64_t fallback) const {
  if (!has(key)) return fallback;
  return decimal(key, lo, hi);
}

Result<double> Fields::numberOr(std::string_view key, double lo, double hi, double fallback) const {
  if (!has(key)) return fallback;
  return number(key, lo, hi);
}

Result<bool> Fields::booleanOr(std::string_view key, bool fallback) const {
  if (!has(key)) return fallback;
  return boolean(key);
}

Result<std::optional<std::string>> Fields::optionalText(std::string_view key, size_t maxLength) const {
  if (!has(key)) return std::optional<std::string>();
  FERRY_ASSIGN_OR_RETURN(std::string s, text(key, maxLength));
  return std::optional<std::string>(std::move(s));
}

}  // namespace ferry::json
