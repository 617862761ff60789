// A small, strict JSON value type: what ferry exchanges out of band (paths now, endpoint metadata
// later). Strict means RFC 8259 and nothing more: no comments, no trailing commas, no NaN or
// Infinity, no duplicate object keys, UTF-8 only, at most kMaxDepth nested arrays/objects.
//
// Numbers keep their kind: an integer literal that fits in int64 stays an exact int64; anything
// else (a fraction, an exponent, an integer beyond int64) is a double. serialize() writes doubles so
// that they parse back as doubles ("2.0", never "2").
//
// Nothing here throws or aborts on bad input: parse() returns kInvalidArgument with the byte offset
// of the first problem, and the accessors return a Result or a pointer (nullptr when the value is
// of another kind). Values are plain data, safe to use from one thread at a time.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "ferry/common/status.h"

namespace ferry::json {

// Deepest nesting of arrays and objects parse() accepts ("[[1]]" has depth 2).
inline constexpr int kMaxDepth = 64;

enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };

// "null", "bool", "number", "string", "array", "object".
const char* typeName(Type type);

class Value;
using Array = std::vector<Value>;
// Members in insertion (or document) order.
using Member = std::pair<std::string, Value>;
using Object = std::vector<Member>;

// The integer types a Value takes as an exact int64. uint64_t is deliberately not one of them: a
// caller with a value beyond int64 picks int64 or double explicitly.
template <typename T>
concept LosslessInteger =
    std::integral<T> && !std::same_as<T, bool> && (std::is_signed_v<T> || sizeof(T) < sizeof(int64_t));

class Value {
 public:
  Value() = default;        // null
  Value(std::nullptr_t) {}  // NOLINT(google-explicit-constructor)
  Value(bool b) : v_(b) {}  // NOLINT(google-explicit-constructor)
  // Any integer that converts to int64 without loss (see LosslessInteger).
  template <LosslessInteger T>
  Value(T i) : v_(static_cast<int64_t>(i)) {}        // NOLINT(google-explicit-constructor)
  Value(double d) : v_(d) {}                         // NOLINT(google-explicit-constructor)
  Value(const char* s) : v_(std::string(s)) {}       // NOLINT(google-explicit-constructor)
  Value(std::string_view s) : v_(std::string(s)) {}  // NOLINT(google-explicit-constructor)
  Value(std::string s) : v_(std::move(s)) {}         // NOLINT(google-explicit-constructor)
  Value(Array a) : v_(std::move(a)) {}               // NOLINT(google-explicit-constructor)
  Value(Object o) : v_(std::move(o)) {}              // NOLINT(google-explicit-constructor)

  static Value emptyArray() { return Value(Array{}); }
  static Value emptyObject() { return Value(Object{}); }

  Type type() const;
  bool isNull() const { return type() == Type::kNull; }
  bool isBool() const { return type() == Type::kBool; }
  bool isNumber() const { return type() == Type::kNumber; }
  // A number stored as an exact int64 (an integer literal within int64's range).
  bool isInt() const { return std::holds_alternative<int64_t>(v_); }
  bool isString() const { return type() == Type::kString; }
  bool isArray() const { return type() == Type::kArray; }
  bool isObject() const { return type() == Type::kObject; }

  // kInvalidArgument when the value is of another kind.
  Result<bool> getBool() const;
  // An integer: an exact int64, or a double with no fractional part within int64's range.
  // kInvalidArgument for anything else (non-numbers, 1.5, 1e300).
  Result<int64_t> getInt() const;
  // Any number, as a double (int64 values beyond 2^53 round).
  Result<double> getDouble() const;
  // A view of the stored string, valid while this value is alive and unchanged.
  Result<std::string_view> getString() const;

  // The elements or members; nullptr when the value is of another kind.
  const Array* array() const { return std::get_if<Array>(&v_); }
  Array* array() { return std::get_if<Array>(&v_); }
  const Object* object() const { return std::get_if<Object>(&v_); }
  Object* object() { return std::get_if<Object>(&v_); }

  // The member named key of an object; nullptr when absent or when this is not an object.
  const Value* find(std::string_view key) const;
  // Sets member key of an object (replacing an existing one in place, else appending) and returns
  // it. A null value first becomes an empty object; on any other kind this returns nullptr and
  // changes nothing.
  Value* set(std::string key, Value value);
  // Appends to an array (a null value first becomes an empty array); nullptr on any other kind.
  Value* push(Value value);

  // Same kind and same contents (an int64 1 and a double 1.0 differ; member order matters).
  bool operator==(const Value& other) const { return v_ == other.v_; }

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, Array, Object> v_;
};

// Parses one JSON text (optional surrounding whitespace, nothing after it). kInvalidArgument with
// "json: <problem> at offset N" for anything malformed, too deep, or not valid UTF-8.
Result<Value> parse(std::string_view text);

// Compact JSON (no spaces). Non-finite doubles become null; bytes that are not valid UTF-8 in a
// string become U+FFFD, so the output always parses.
std::string serialize(const Value& value);

}  // namespace ferry::json
