// The strict field reader (common/json_fields.h): each reader's accepts and refusals, and the
// wording every decoder of peer input inherits from it.
#include "common/json_fields.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

namespace ferry::json {
namespace {

Value parsed(std::string_view text) {
  Result<Value> r = parse(text);
  EXPECT_TRUE(r.isOk()) << text << ": " << r.status().toString();
  return r.isOk() ? std::move(r).value() : Value();
}

FieldErrors peerErrors() { return {.code = StatusCode::kProtocolError, .prefix = "test message: "}; }

// The bounds of the decimal() cases below, and int64's own.
constexpr int64_t kLo = -9;
constexpr int64_t kHi = 9;
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// A refusal with the reader's code and exactly this text.
void expectRefusal(const Status& st, const std::string& text) {
  ASSERT_FALSE(st.isOk()) << "accepted; expected: " << text;
  EXPECT_EQ(st.code(), StatusCode::kProtocolError);
  EXPECT_EQ(st.message(), text);
}
template <typename T>
void expectRefusal(const Result<T>& r, const std::string& text) {
  ASSERT_FALSE(r.isOk()) << "accepted; expected: " << text;
  expectRefusal(r.status(), text);
}

TEST(JsonFieldsTest, Text) {
  Value v = parsed(R"({"s": "abc", "n": 1, "empty": ""})");
  Fields f(v, peerErrors());
  EXPECT_EQ(*f.text("s", 3), "abc");
  EXPECT_EQ(*f.text("empty", 0), "");
  expectRefusal(f.text("s", 2), "test message: \"s\" is longer than 2");
  expectRefusal(f.text("n", 8), "test message: \"n\" must be a string");
  expectRefusal(f.text("gone", 8), "test message: \"gone\" is missing");
}

TEST(JsonFieldsTest, IntegerIsExactAndInRange) {
  Value v = parsed(
      R"({"i": 7, "whole": 7.0, "neg": -3, "half": 1.5, "huge": 1e300, "big": 9223372036854775808,
          "s": "7", "b": true, "max": 9223372036854775807})");
  Fields f(v, peerErrors());
  EXPECT_EQ(*f.integer("i", 0, 7), 7);
  EXPECT_EQ(*f.integer("whole", 0, 7), 7);
  EXPECT_EQ(*f.integer("neg", -3, 0), -3);
  EXPECT_EQ(*f.integer("max", 0, std::numeric_limits<int64_t>::max()), std::numeric_limits<int64_t>::max());
  expectRefusal(f.integer("i", 0, 6), "test message: \"i\" must be an integer in [0, 6], not 7");
  expectRefusal(f.integer("i", 8, 9), "test message: \"i\" must be an integer in [8, 9], not 7");
  expectRefusal(f.integer("neg", 0, 9), "test message: \"neg\" must be an integer in [0, 9], not -3");
  expectRefusal(f.integer("half", 0, 9), "test message: \"half\" must be an integer in [0, 9], not 1.5");
  EXPECT_FALSE(
      f.integer("huge", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()).isOk());
  EXPECT_FALSE(f.integer("big", 0, std::numeric_limits<int64_t>::max()).isOk());
  expectRefusal(f.integer("s", 0, 9), "test message: \"s\" must be an integer in [0, 9], not \"7\"");
  EXPECT_FALSE(f.integer("b", 0, 9).isOk());
  expectRefusal(f.integer("gone", 0, 9), "test message: \"gone\" is missing");
}

TEST(JsonFieldsTest, DecimalReadsANumberOrADecimalString) {
  Value v = parsed(R"({"n": 7, "whole": 7.0, "s": "7587869", "neg": "-3", "zero": "0",
                       "max": "9223372036854775807", "min": "-9223372036854775808"})");
  Fields f(v, peerErrors());
  EXPECT_EQ(*f.decimal("n", 0, 9), 7);
  EXPECT_EQ(*f.decimal("whole", 0, 9), 7);
  EXPECT_EQ(*f.decimal("s", 0, kMax), 7587869);
  EXPECT_EQ(*f.decimal("neg", -3, 0), -3);
  EXPECT_EQ(*f.decimal("zero", 0, 0), 0);
  // The whole int64 range, which a JSON number read as a double cannot hold.
  EXPECT_EQ(*f.decimal("max", 0, kMax), kMax);
  EXPECT_EQ(*f.decimal("min", kMin, 0), kMin);
  expectRefusal(f.decimal("gone", 0, 9), "test message: \"gone\" is missing");
}

TEST(JsonFieldsTest, DecimalRefusesWhatIsNotDecimalDigits) {
  // Only an optional '-' and digits: no sign '+', no space, no fraction or exponent, no other base.
  for (const char* text :
       {"+7", " 7", "7 ", "\t7", "1.5", "7.0", "1e3", "0x10", "12x", "x", "", "-", "--7"}) {
    Value v = Value::emptyObject();
    v.set("d", text);
    expectRefusal(Fields(v, peerErrors()).decimal("d", kLo, kHi),
                  "test message: \"d\" must be an integer in [-9, 9], not " + serialize(Value(text)));
  }
  // Other kinds, and numbers that are no exact integer, as integer() refuses them.
  Value kinds = parsed(R"({"half": 1.5, "b": true, "null": null, "o": {}, "a": ["7"]})");
  Fields f(kinds, peerErrors());
  expectRefusal(f.decimal("half", kLo, kHi), "test message: \"half\" must be an integer in [-9, 9], not 1.5");
  expectRefusal(f.decimal("b", kLo, kHi), "test message: \"b\" must be an integer in [-9, 9], not true");
  expectRefusal(f.decimal("null", kLo, kHi),
                "test message: \"null\" must be an integer in [-9, 9], not null");
  expectRefusal(f.decimal("o", kLo, kHi), "test message: \"o\" must be an integer in [-9, 9], not {}");
  expectRefusal(f.decimal("a", kLo, kHi), "test message: \"a\" must be an integer in [-9, 9], not [\"7\"]");
}

TEST(JsonFieldsTest, DecimalRefusesOutOfRange) {
  Value v = parsed(R"({"ten": "10", "minus": "-10", "n": 10, "over": "9223372036854775808",
                       "under": "-9223372036854775809", "huge": "99999999999999999999"})");
  Fields f(v, peerErrors());
  expectRefusal(f.decimal("ten", kLo, kHi),
                "test message: \"ten\" must be an integer in [-9, 9], not \"10\"");
  expectRefusal(f.decimal("minus", kLo, kHi),
                "test message: \"minus\" must be an integer in [-9, 9], not \"-10\"");
  expectRefusal(f.decimal("n", kLo, kHi), "test message: \"n\" must be an integer in [-9, 9], not 10");
  // Beyond int64 itself, whatever the bounds.
  expectRefusal(f.decimal("over", kMin, kMax),
                "test message: \"over\" must be an integer in "
                "[-9223372036854775808, 9223372036854775807], not "
                "\"9223372036854775808\"");
  expectRefusal(f.decimal("under", kMin, kMax),
                "test message: \"under\" must be an integer in "
                "[-9223372036854775808, 9223372036854775807], not "
                "\"-9223372036854775809\"");
  expectRefusal(f.decimal("huge", 0, 9),
                "test message: \"huge\" must be an integer in [0, 9], not \"99999999999999999999\"");
}

TEST(JsonFieldsTest, DecimalOrGivesTheFallbackOnlyWhenAbsent) {
  Value v = parsed(R"({"s": "5", "n": 4, "zero": "0", "bad": "5s", "far": "12"})");
  Fields f(v, peerErrors());
  EXPECT_EQ(*f.decimalOr("gone", kLo, kHi, 3), 3);
  EXPECT_EQ(*f.decimalOr("s", kLo, kHi, 3), 5);
  EXPECT_EQ(*f.decimalOr("n", kLo, kHi, 3), 4);
  EXPECT_EQ(*f.decimalOr("zero", kLo, kHi, 3), 0);  // present, so not the fallback
  // Present is checked as strictly as a required member: no fallback for a bad value.
  expectRefusal(f.decimalOr("bad", kLo, kHi, 3),
                "test message: \"bad\" must be an integer in [-9, 9], not \"5s\"");
  expectRefusal(f.decimalOr("far", kLo, kHi, 3),
                "test message: \"far\" must be an integer in [-9, 9], not \"12\"");
}

TEST(JsonFieldsTest, OffendingValueIsCut) {
  std::string longText(200, 'x');
  Value v = Value::emptyObject();
  v.set("s", longText);
  Fields f(v, peerErrors());
  Result<int64_t> r = f.integer("s", 0, 1);
  ASSERT_FALSE(r.isOk());
  EXPECT_LT(r.status().message().size(), 150u) << r.status().message();
}

TEST(JsonFieldsTest, Number) {
  Value v = parsed(R"({"d": 0.5, "i": 2, "s": "0.5", "huge": 1e300})");
  Fields f(v, peerErrors());
  EXPECT_EQ(*f.number("d", 0, 1), 0.5);
  EXPECT_EQ(*f.number("i", 0, 2), 2.0);
  EXPECT_EQ(*f.number("huge", 0, 1e308), 1e300);
  expectRefusal(f.number("d", 1, 2), "test message: \"d\" must be a number in [1, 2], not 0.5");
  expectRefusal(f.number("s", 0, 1), "test message: \"s\" must be a number in [0, 1], not \"0.5\"");
  EXPECT_FALSE(f.number("huge", 0, 1e9).isOk());
  expectRefusal(f.number("gone", 0, 1), "test message: \"gone\" is missing");
}

TEST(JsonFieldsTest, Boolean) {
  Value v = parsed(R"({"t": true, "f": false, "one": 1, "s": "true"})");
  Fields f(v, peerErrors());
  EXPECT_TRUE(*f.boolean("t"));
  EXPECT_FALSE(*f.boolean("f"));
  expectRefusal(f.boolean("one"), "test message: \"one\" must be true or false");
  expectRefusal(f.boolean("s"), "test message: \"s\" must be true or false");
  expectRefusal(f.boolean("gone"), "test message: \"gone\" is missing");
}

TEST(JsonFieldsTest, Arrays) {
  Value v = parsed(R"({"a": [1, 2, 3], "o": {}, "empty": []})");
  Fields f(v, peerErrors());
  EXPECT_EQ((*f.array("a", 3))->size(), 3u);
  EXPECT_EQ((*f.array("empty", 0))->size(), 0u);
  expectRefusal(f.array("a", 2), "test message: \"a\" has more than 2 elements");
  expectRefusal(f.array("o", 2), "test message: \"o\" must be an array");
  expectRefusal(f.array("gone", 2), "test message: \"gone\" is missing");
  EXPECT_EQ((*f.exactArray("a", 3))->size(), 3u);
  expectRefusal(f.exactArray("a", 4), "test message: \"a\" must have 4 elements, not 3");
  expectRefusal(f.exactArray("a", 2), "test message: \"a\" must have 2 elements, not 3");
  expectRefusal(f.exactArray("o", 0), "test message: \"o\" must be an array");
}

TEST(JsonFieldsTest, NestedObjects) {
  Value v = parsed(R"({"o": {"inner": {"n": 5, "x": 1}}, "a": []})");
  Fields f(v, peerErrors());
  const Value* o = *f.object("o");
  Fields of(*o, peerErrors());
  const Value* inner = *of.object("inner");
  Fields in(*inner, peerErrors());
  EXPECT_EQ(*in.integer("n", 0, 9), 5);
  expectRefusal(in.only({"n"}), "test message: \"x\" is an unknown member");
  EXPECT_TRUE(in.only({"n", "x"}).isOk());
  expectRefusal(f.object("a"), "test message: \"a\" must be an object");
  expectRefusal(f.object("gone"), "test message: \"gone\" is missing");
}

TEST(JsonFieldsTest, OnlyNamesTheUnknownMember) {
  Value v = parsed(R"({"a": 1, "b": 2})");
  Fields f(v, peerErrors());
  EXPECT_TRUE(f.only({"a", "b", "c"}).isOk());
  expectRefusal(f.only({"a"}), "test message: \"b\" is an unknown member");
  expectRefusal(f.only({}), "test message: \"a\" is an unknown member");

  // A peer's odd member name comes back escaped and cut, on one line.
  Value odd = Value::emptyObject();
  odd.set("bad\nname" + std::string(100, 'z'), 1);
  Status st = Fields(odd, peerErrors()).only({"a"});
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  EXPECT_LT(st.message().size(), 120u) << st.message();

  Value notObject = parsed("[1]");
  Fields g(notObject, peerErrors());
  expectRefusal(g.only({"a"}), "test message: not a JSON object");
  expectRefusal(g.text("a", 1), "test message: \"a\" is missing");
}

TEST(JsonFieldsTest, AbsentIsFineWhereOptional) {
  Value v = parsed(R"({"s": "x", "i": 3, "d": 0.25, "b": false, "bad": []})");
  Fields f(v, peerErrors());
  EXPECT_TRUE(f.has("s"));
  EXPECT_FALSE(f.has("gone"));
  EXPECT_EQ(*f.textOr("s", 4, "fallback"), "x");
  EXPECT_EQ(*f.textOr("gone", 4, "fallback"), "fallback");
  EXPECT_EQ(*f.integerOr("i", 0, 9, 1), 3);
  EXPECT_EQ(*f.integerOr("gone", 0, 9, 1), 1);
  EXPECT_EQ(*f.numberOr("d", 0, 1, 0.5), 0.25);
  EXPECT_EQ(*f.numberOr("gone", 0, 1, 0.5), 0.5);
  EXPECT_FALSE(*f.booleanOr("b", true));
  EXPECT_TRUE(*f.booleanOr("gone", true));
  EXPECT_EQ(**f.optionalText("s", 4), "x");
  EXPECT_FALSE(f.optionalText("gone", 4)->has_value());
  // Present is checked as strictly as a required member.
  expectRefusal(f.textOr("bad", 4, ""), "test message: \"bad\" must be a string");
  expectRefusal(f.integerOr("i", 4, 9, 5), "test message: \"i\" must be an integer in [4, 9], not 3");
  expectRefusal(f.booleanOr("bad", true), "test message: \"bad\" must be true or false");
  expectRefusal(f.numberOr("bad", 0, 1, 0), "test message: \"bad\" must be a number in [0, 1], not []");
  expectRefusal(f.optionalText("s", 0), "test message: \"s\" is longer than 0");
}

TEST(JsonFieldsTest, ControlProtocolWording) {
  Value v = parsed(R"({"type": "hello", "n": "x"})");
  Fields f(v, {.code = StatusCode::kProtocolError,
               .prefix = "control message 'hello': ",
               .names = FieldErrors::Names::kFieldWord});
  expectRefusal(f.integer("n", 0, 9),
                "control message 'hello': field 'n' must be an integer in [0, 9], not \"x\"");
  expectRefusal(f.text("gone", 9), "control message 'hello': field 'gone' is missing");
  expectRefusal(f.only({"type"}), "control message 'hello': field 'n' is an unknown member");

  Value odd = Value::emptyObject();
  odd.set("it's\n", 1);
  Status st = Fields(odd, {.prefix = "p: ", .names = FieldErrors::Names::kFieldWord}).only({});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "p: field 'it?s?' is an unknown member");
}

TEST(JsonFieldsTest, RefuseWordsItsOwnProblems) {
  Value v = Value::emptyObject();
  Fields f(v, peerErrors());
  Status member = f.refuse("nonce", "is not 32 hex digits");
  EXPECT_EQ(member.code(), StatusCode::kProtocolError);
  EXPECT_EQ(member.message(), "test message: \"nonce\" is not 32 hex digits");
  EXPECT_EQ(f.refuse("unknown type 'x'").message(), "test message: unknown type 'x'");
  EXPECT_EQ(peerErrors().refuse("not JSON").message(), "test message: not JSON");
}

}  // namespace
}  // namespace ferry::json
