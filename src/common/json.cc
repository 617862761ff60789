#include "common/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

namespace ferry::json {

const char* typeName(Type type) {
  switch (type) {
    case Type::kNull: return "null";
    case Type::kBool: return "bool";
    case Type::kNumber: return "number";
    case Type::kString: return "string";
    case Type::kArray: return "array";
    case Type::kObject: return "object";
  }
  return "unknown";
}

Type Value::type() const {
  switch (v_.index()) {
    case 0: return Type::kNull;
    case 1: return Type::kBool;
    case 2:
    case 3: return Type::kNumber;
    case 4: return Type::kString;
    case 5: return Type::kArray;
    default: return Type::kObject;
  }
}

Result<bool> Value::getBool() const {
  if (const bool* b = std::get_if<bool>(&v_)) return *b;
  return invalidArgument(std::string("json: expected a bool, found ") + typeName(type()));
}

Result<int64_t> Value::getInt() const {
  if (const int64_t* i = std::get_if<int64_t>(&v_)) return *i;
  if (const double* d = std::get_if<double>(&v_)) {
    // [-2^63, 2^63) is exactly representable at both ends; anything outside would overflow the cast.
    constexpr double kLimit = 9223372036854775808.0;
    if (std::isfinite(*d) && std::trunc(*d) == *d && *d >= -kLimit && *d < kLimit) {
      return static_cast<int64_t>(*d);
    }
    return invalidArgument("json: expected an integer, found a number with a fraction or beyond 64 bits");
  }
  return invalidArgument(std::string("json: expected an integer, found ") + typeName(type()));
}

Result<double> Value::getDouble() const {
  if (const double* d = std::get_if<double>(&v_)) return *d;
  if (const int64_t* i = std::get_if<int64_t>(&v_)) return static_cast<double>(*i);
  return invalidArgument(std::string("json: expected a number, found ") + typeName(type()));
}

Result<std::string_view> Value::getString() const {
  if (const std::string* s = std::get_if<std::string>(&v_)) return std::string_view(*s);
  return invalidArgument(std::string("json: expected a string, found ") + typeName(type()));
}

const Value* Value::find(std::string_view key) const {
  const Object* members = object();
  if (members == nullptr) return nullptr;
  for (const Member& m : *members) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

Value* Value::set(std::string key, Value value) {
  if (isNull()) v_ = Object{};
  Object* members = object();
  if (members == nullptr) return nullptr;
  for (Member& m : *members) {
    if (m.first == key) {
      m.second = std::move(value);
      return &m.second;
    }
  }
  members->emplace_back(std::move(key), std::move(value));
  return &members->back().second;
}

Value* Value::push(Value value) {
  if (isNull()) v_ = Array{};
  Array* elements = array();
  if (elements == nullptr) return nullptr;
  elements->push_back(std::move(value));
  return &elements->back();
}

// ---------------------------------------------------------------------------------------------
// UTF-8

namespace {

// Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one (overlong forms,
// surrogates and code points above U+10FFFF are invalid, per RFC 3629).
size_t utf8SequenceLen(const unsigned char* s, size_t n) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // UTF-16 surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (n < len) return 0;
  if (s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < len; ++i) {
    if ((s[i] & 0xC0) != 0x80) return 0;
  }
  return len;
}

void appendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// A key as it may appear in an error message: the text comes from a peer, so it is cut short and
// anything but printable ASCII is shown as '?'.
std::string printable(std::string_view text) {
  constexpr size_t kMaxShown = 40;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    char c = text[i];
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  if (text.size() > kMaxShown) out += "...";
  return out;
}

// ---------------------------------------------------------------------------------------------
// Parser: recursive descent, bounded by kMaxDepth so hostile input cannot exhaust the stack.

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Result<Value> parseDocument() {
    skipSpace();
    Value value;
    if (!parseValue(value, 0)) return error_;
    skipSpace();
    if (pos_ != text_.size()) {
      fail("unexpected data after the value");
      return error_;
    }
    return value;
  }

 private:
  bool fail(const std::string& what) {
    error_ = invalidArgument("json: " + what + " at offset " + std::to_string(pos_));
    return false;
  }

  bool atEnd() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }

  void skipSpace() {
    while (!atEnd()) {
      char c = peek();
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  bool consumeLiteral(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return fail("invalid literal");
    pos_ += word.size();
    return true;
  }

  bool parseValue(Value& out, int depth) {
    if (atEnd()) return fail("unexpected end of input");
    switch (peek()) {
      case 'n':
        if (!consumeLiteral("null")) return false;
        out = Value();
        return true;
      case 't':
        if (!consumeLiteral("true")) return false;
        out = Value(true);
        return true;
      case 'f':
        if (!consumeLiteral("false")) return false;
        out = Value(false);
        return true;
      case '"': {
        std::string s;
        if (!parseString(s)) return false;
        out = Value(std::move(s));
        return true;
      }
      case '[': return parseArray(out, depth + 1);
      case '{': return parseObject(out, depth + 1);
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parseNumber(out);
        return fail("unexpected character");
    }
  }

  bool parseArray(Value& out, int depth) {
    if (depth > kMaxDepth) return fail("nesting deeper than " + std::to_string(kMaxDepth));
    ++pos_;  // '['
    Array elements;
    skipSpace();
    if (!atEnd() && peek() == ']') {
      ++pos_;
      out = Value(std::move(elements));
      return true;
    }
    for (;;) {
      skipSpace();
      Value element;
      if (!parseValue(element, depth)) return false;
      elements.push_back(std::move(element));
      skipSpace();
      if (atEnd()) return fail("unterminated array");
      char c = peek();
      ++pos_;
      if (c == ']') break;
      if (c != ',') {
        --pos_;
        return fail("expected ',' or ']'");
      }
    }
    out = Value(std::move(elements));
    return true;
  }

  bool parseObject(Value& out, int depth) {
    if (depth > kMaxDepth) return fail("nesting deeper than " + std::to_string(kMaxDepth));
    size_t start = pos_;
    ++pos_;  // '{'
    Object members;
    skipSpace();
    if (!atEnd() && peek() == '}') {
      ++pos_;
      out = Value(std::move(members));
      return true;
    }
    for (;;) {
      skipSpace();
      if (atEnd() || peek() != '"') return fail("expected a string key");
      std::string key;
      if (!parseString(key)) return false;
      skipSpace();
      if (atEnd() || peek() != ':') return fail("expected ':'");
      ++pos_;
      skipSpace();
      Value value;
      if (!parseValue(value, depth)) return false;
      members.emplace_back(std::move(key), std::move(value));
      skipSpace();
      if (atEnd()) return fail("unterminated object");
      char c = peek();
      ++pos_;
      if (c == '}') break;
      if (c != ',') {
        --pos_;
        return fail("expected ',' or '}'");
      }
    }
    // Duplicate keys make a document mean different things to different readers: refuse them.
    // Sorting indices keeps this O(n log n) however many members a hostile document has.
    if (members.size() > 1) {
      std::vector<size_t> order(members.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(),
                [&](size_t a, size_t b) { return members[a].first < members[b].first; });
      for (size_t i = 1; i < order.size(); ++i) {
        if (members[order[i - 1]].first == members[order[i]].first) {
          pos_ = start;
          return fail("duplicate key \"" + printable(members[order[i]].first) + "\" in the object");
        }
      }
    }
    out = Value(std::move(members));
    return true;
  }

  bool parseHex4(uint32_t& out) {
    if (text_.size() - pos_ < 4) return fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return fail("invalid hex digit in \\u escape");
      }
    }
    pos_ += 4;
    out = v;
    return true;
  }

  bool parseString(std::string& out) {
    ++pos_;  // opening quote
    for (;;) {
      if (atEnd()) return fail("unterminated string");
      auto c = static_cast<unsigned char>(peek());
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return fail("unescaped control character in a string");
      if (c == '\\') {
        if (!parseEscape(out)) return false;
        continue;
      }
      size_t len =
          utf8SequenceLen(reinterpret_cast<const unsigned char*>(text_.data()) + pos_, text_.size() - pos_);
      if (len == 0) return fail("invalid UTF-8 in a string");
      out.append(text_.data() + pos_, len);
      pos_ += len;
    }
  }

  // One escape sequence in a string, from its backslash.
  bool parseEscape(std::string& out) {
    ++pos_;
    if (atEnd()) return fail("unterminated escape");
    char e = peek();
    ++pos_;
    switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': return parseUnicodeEscape(out);
      default: --pos_; return fail("invalid escape");
    }
    return true;
  }

  // A \u escape after its "\u": one code point, or a surrogate pair written as two escapes.
  bool parseUnicodeEscape(std::string& out) {
    uint32_t cp = 0;
    if (!parseHex4(cp)) return false;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("unpaired low surrogate in \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (text_.substr(pos_, 2) != "\\u") return fail("unpaired high surrogate in \\u escape");
      pos_ += 2;
      uint32_t low = 0;
      if (!parseHex4(low)) return false;
      if (low < 0xDC00 || low > 0xDFFF) return fail("high surrogate not followed by a low one");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    appendUtf8(out, cp);
    return true;
  }

  // What scanning a number learned, for its conversion.
  struct NumberScan {
    bool integral = true;      // no fraction and no exponent
    bool significant = false;  // a nonzero digit was seen
    // Decimal exponent of the leading significant digit, to tell overflow from underflow.
    int64_t magnitude = 0;
    int64_t exponent = 0;  // the written exponent, saturated
  };

  bool isDigitAt(size_t at) const { return at < text_.size() && text_[at] >= '0' && text_[at] <= '9'; }

  bool parseNumber(Value& out) {
    size_t start = pos_;
    if (peek() == '-') ++pos_;
    NumberScan scan;
    if (!scanIntegerPart(scan) || !scanFraction(scan) || !scanExponent(scan)) return false;
    return convertNumber(start, scan, out);
  }

  bool scanIntegerPart(NumberScan& scan) {
    if (!isDigitAt(pos_)) return fail("expected a digit");
    if (text_[pos_] == '0') {
      ++pos_;
      if (isDigitAt(pos_)) return fail("leading zero in a number");
      scan.magnitude = -1;  // "0.00d": each further zero moves d one place down
    } else {
      scan.significant = true;
      scan.magnitude = -1;
      while (isDigitAt(pos_)) {
        ++pos_;
        if (scan.magnitude < 1000000) ++scan.magnitude;
      }
    }
    return true;
  }

  bool scanFraction(NumberScan& scan) {
    if (pos_ >= text_.size() || text_[pos_] != '.') return true;
    scan.integral = false;
    ++pos_;
    if (!isDigitAt(pos_)) return fail("expected a digit after '.'");
    while (isDigitAt(pos_)) {
      if (!scan.significant) {
        if (text_[pos_] != '0') {
          scan.significant = true;
        } else if (scan.magnitude > -1000000) {
          --scan.magnitude;
        }
      }
      ++pos_;
    }
    return true;
  }

  bool scanExponent(NumberScan& scan) {
    if (pos_ >= text_.size() || (text_[pos_] != 'e' && text_[pos_] != 'E')) return true;
    scan.integral = false;
    ++pos_;
    bool negative = false;
    if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
      negative = text_[pos_] == '-';
      ++pos_;
    }
    if (!isDigitAt(pos_)) return fail("expected a digit in the exponent");
    while (isDigitAt(pos_)) {
      // Saturate: the exact value of an absurd exponent does not matter, only its sign.
      if (scan.exponent < 1000000) scan.exponent = scan.exponent * 10 + (text_[pos_] - '0');
      ++pos_;
    }
    if (negative) scan.exponent = -scan.exponent;
    return true;
  }

  // The scanned text [start, pos_) as an int64 when it is an integer that fits, else a double.
  bool convertNumber(size_t start, const NumberScan& scan, Value& out) {
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (scan.integral) {
      int64_t i = 0;
      auto [ptr, ec] = std::from_chars(first, last, i);
      if (ec == std::errc() && ptr == last) {
        out = Value(i);
        return true;
      }
      // Beyond int64: fall through to a double.
    }
    double d = 0;
    auto [ptr, ec] = std::from_chars(first, last, d);
    if (ec == std::errc::result_out_of_range) {
      if (scan.significant && scan.magnitude + scan.exponent > 0) {
        pos_ = start;
        return fail("number out of range");
      }
      // Underflow: the nearest double is a (signed) zero.
      d = text_[start] == '-' ? -0.0 : 0.0;
    } else if (ec != std::errc() || ptr != last) {
      pos_ = start;
      return fail("malformed number");
    }
    if (!std::isfinite(d)) {
      pos_ = start;
      return fail("number out of range");
    }
    out = Value(d);
    return true;
  }

  std::string_view text_;
  size_t pos_ = 0;
  Status error_;
};

// ---------------------------------------------------------------------------------------------
// Serializer

void serializeString(std::string_view s, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  const auto* bytes = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = bytes[i];
    switch (c) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\b':
        out += "\\b";
        ++i;
        continue;
      case '\f':
        out += "\\f";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      default: break;
    }
    if (c < 0x20) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
      ++i;
      continue;
    }
    size_t len = utf8SequenceLen(bytes + i, s.size() - i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      ++i;
      continue;
    }
    out.append(s.data() + i, len);
    i += len;
  }
  out += '"';
}

void serializeDouble(double d, std::string& out) {
  if (!std::isfinite(d)) {
    out += "null";
    return;
  }
  char buffer[64];
  auto [ptr, ec] = std::to_chars(buffer, buffer + sizeof buffer, d);
  if (ec != std::errc()) {
    out += "null";
    return;
  }
  std::string_view text(buffer, static_cast<size_t>(ptr - buffer));
  out += text;
  // Keep the kind: "2" would parse back as an int64.
  if (text.find_first_of(".eE") == std::string_view::npos) out += ".0";
}

void serializeValue(const Value& value, std::string& out) {
  switch (value.type()) {
    case Type::kNull: out += "null"; return;
    case Type::kBool: out += *value.getBool() ? "true" : "false"; return;
    case Type::kNumber:
      if (value.isInt()) {
        char buffer[32];
        auto [ptr, ec] = std::to_chars(buffer, buffer + sizeof buffer, *value.getInt());
        out.append(buffer, static_cast<size_t>(ptr - buffer));
      } else {
        serializeDouble(*value.getDouble(), out);
      }
      return;
    case Type::kString: serializeString(*value.getString(), out); return;
    case Type::kArray: {
      out += '[';
      bool first = true;
      for (const Value& element : *value.array()) {
        if (!first) out += ',';
        first = false;
        serializeValue(element, out);
      }
      out += ']';
      return;
    }
    case Type::kObject: {
      out += '{';
      bool first = true;
      for (const Member& m : *value.object()) {
        if (!first) out += ',';
        first = false;
        serializeString(m.first, out);
        out += ':';
        serializeValue(m.second, out);
      }
      out += '}';
      return;
    }
  }
}

}  // namespace

Result<Value> parse(std::string_view text) { return Parser(text).parseDocument(); }

std::string serialize(const Value& value) {
  std::string out;
  serializeValue(value, out);
  return out;
}

}  // namespace ferry::json
