// Fields: the one strict reader of the members of a JSON object that a peer sent. Every decoder of
// peer input (wireup lines, connector metadata and messages, control-channel messages, paths, endpoint
// metadata) reads its fields through it, so each refuses the same things with the same words.
//
//   json::Fields f(message, {.code = StatusCode::kProtocolError, .prefix = "wireup message: "});
//   FERRY_RETURN_IF_ERROR(f.only({"type", "conn", "nonce"}));
//   FERRY_ASSIGN_OR_RETURN(int64_t conn, f.integer("conn", 0, int64_t{1} << 62));
//   FERRY_ASSIGN_OR_RETURN(std::string nonce, f.text("nonce", 32));
//
// What is refused, each as Status(errors.code, errors.prefix + <member> + " " + <problem>), where
// <member> is the member's name as JSON text ("conn") or, for the control protocols, field 'conn':
//   a required member that is absent                    -> "is missing"
//   a member of another kind                            -> "must be a string" / "must be an integer
//                                                          in [lo, hi], not V" / "must be true or
//                                                          false" / "must be an array" / ...
//   a string longer than maxLength bytes                -> "is longer than N"
//   a number outside [lo, hi]; for integer(), any
//   number with a fraction or beyond int64 (1.5, 1e300);
//   for decimal(), also a string that is not one in
//   decimal digits ("", "x", "+7", " 7", "1.5")         -> "must be an integer in [lo, hi], not V"
//   an array with more than maxItems (or not exactly
//   count) elements                                     -> "has more than N elements" /
//                                                          "must have N elements, not M"
//   a member only() does not allow                      -> "is an unknown member"
// V is the offending value as JSON, cut to 64 bytes; a peer's unknown member name is cut to 64 bytes
// and escaped, so a refusal is always one printable line.
//
// An integer is any number whose value is an exact int64 (7 and 7.0 alike, as json::Value::getInt()
// reads it); a decoder that wants integer literals only checks isInt() itself. decimal() reads what
// proto3's JSON mapping writes for a 64-bit integer (etcd's answers): a string of decimal digits,
// "-" first if negative ("7587869"), since a JSON number read as a double cannot hold every int64;
// like a proto3 reader, it takes the integer as a number too.
//
// A Fields refers to the value it reads (and the results of array()/object() point into it): the
// value must outlive it. A Fields is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "common/json.h"
#include "ferry/common/status.h"

namespace ferry::json {

// How a decoder words its refusals.
struct FieldErrors {
  // How a member is named in a refusal.
  enum class Names : uint8_t {
    kQuoted,     // "name" (as JSON text)
    kFieldWord,  // field 'name' (the control protocols' wording, which their peers match)
  };
  StatusCode code = StatusCode::kInvalidArgument;
  std::string prefix;  // put before every problem, e.g. "wireup message: "
  Names names = Names::kQuoted;

  // A refusal of the whole value in these words: Status(code, prefix + what).
  Status refuse(const std::string& what) const { return Status(code, prefix + what); }
};

class Fields {
 public:
  // Reads the members of `object` (which must outlive this reader). A value that is not an object
  // reads as an object without members: every required field is missing.
  Fields(const Value& object, FieldErrors errors) : v_(object), errors_(std::move(errors)) {}

  // OK when every member is one of `allowed`, else a refusal naming the first other one. A value that
  // is not an object is refused ("not a JSON object").
  Status only(std::initializer_list<std::string_view> allowed) const;
  // Whether the member is present (of any kind).
  bool has(std::string_view key) const { return v_.find(key) != nullptr; }

  // A string of at most maxLength bytes.
  Result<std::string> text(std::string_view key, size_t maxLength) const;
  // An exact integer in [lo, hi].
  Result<int64_t> integer(std::string_view key, int64_t lo, int64_t hi) const;
  // An exact integer in [lo, hi], as integer() reads it or as a string of decimal digits ("-7").
  Result<int64_t> decimal(std::string_view key, int64_t lo, int64_t hi) const;
  // A finite number in [lo, hi], as a double.
  Result<double> number(std::string_view key, double lo, double hi) const;
  // true or false.
  Result<bool> boolean(std::string_view key) const;
  // An array of at most maxItems elements.
  Result<const Array*> array(std::string_view key, size_t maxItems) const;
  // An array of exactly `count` elements.
  Result<const Array*> exactArray(std::string_view key, size_t count) const;
  // An object (its members read with another Fields over the returned value).
  Result<const Value*> object(std::string_view key) const;

  // The same readers where an absent member is fine: `fallback` when absent; a present member is
  // checked exactly as above.
  Result<std::string> textOr(std::string_view key, size_t maxLength, std::string fallback) const;
  Result<int64_t> integerOr(std::string_view key, int64_t lo, int64_t hi, int64_t fallback) const;
  Result<int64_t> decimalOr(std::string_view key, int64_t lo, int64_t hi, int64_t fallback) const;
  Result<double> numberOr(std::string_view key, double lo, double hi, double fallback) const;
  Result<bool> booleanOr(std::string_view key, bool fallback) const;
  // std::nullopt when absent.
  Result<std::optional<std::string>> optionalText(std::string_view key, size_t maxLength) const;

  // A refusal in this reader's words about member `key` ("is not hex"), or about the whole value.
  Status refuse(std::string_view key, const std::string& problem) const;
  Status refuse(const std::string& what) const;

  const Value& value() const { return v_; }
  const FieldErrors& errors() const { return errors_; }

 private:
  const Value& v_;
  FieldErrors errors_;
};

}  // namespace ferry::json
