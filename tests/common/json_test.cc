#include "common/json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace ferry::json {
namespace {

Value parseOk(std::string_view text) {
  Result<Value> r = parse(text);
  EXPECT_TRUE(r.isOk()) << "refused: " << text << ": " << r.status().toString();
  return r.isOk() ? std::move(r).value() : Value();
}

void expectRefused(std::string_view text, const std::string& why = "") {
  Result<Value> r = parse(text);
  ASSERT_FALSE(r.isOk()) << "accepted: " << std::string(text.substr(0, 80));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("offset"), std::string::npos) << r.status().message();
  if (!why.empty()) {
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  }
}

TEST(JsonTest, Scalars) {
  EXPECT_TRUE(parseOk("null").isNull());
  EXPECT_EQ(*parseOk("true").getBool(), true);
  EXPECT_EQ(*parseOk("false").getBool(), false);
  EXPECT_EQ(*parseOk("\"ferry\"").getString(), "ferry");
  EXPECT_EQ(*parseOk(" \t\r\n 7 \n").getInt(), 7);
}

TEST(JsonTest, IntegersStayExact) {
  Value max = parseOk("9223372036854775807");
  ASSERT_TRUE(max.isInt());
  EXPECT_EQ(*max.getInt(), std::numeric_limits<int64_t>::max());
  Value min = parseOk("-9223372036854775808");
  ASSERT_TRUE(min.isInt());
  EXPECT_EQ(*min.getInt(), std::numeric_limits<int64_t>::min());
  // 2^53 + 1 is not a double: an int64 keeps it.
  EXPECT_EQ(*parseOk("9007199254740993").getInt(), 9007199254740993);
  EXPECT_EQ(serialize(parseOk("9007199254740993")), "9007199254740993");
}

TEST(JsonTest, FractionsAndBigIntegersAreDoubles) {
  Value half = parseOk("0.5");
  EXPECT_TRUE(half.isNumber());
  EXPECT_FALSE(half.isInt());
  EXPECT_EQ(*half.getDouble(), 0.5);
  EXPECT_FALSE(half.getInt().isOk());

  Value big = parseOk("18446744073709551616");  // 2^64: beyond int64
  EXPECT_FALSE(big.isInt());
  EXPECT_EQ(*big.getDouble(), 18446744073709551616.0);
  EXPECT_FALSE(big.getInt().isOk());

  EXPECT_EQ(*parseOk("-1.25e2").getDouble(), -125.0);
  EXPECT_EQ(*parseOk("1E+2").getDouble(), 100.0);
  // An integral double converts to an exact integer.
  EXPECT_EQ(*parseOk("3.0").getInt(), 3);
  EXPECT_EQ(*parseOk("1e3").getInt(), 1000);
}

TEST(JsonTest, HugeAndTinyNumbers) {
  expectRefused("1e400", "out of range");
  expectRefused("-1e400", "out of range");
  expectRefused(std::string(400, '9') + ".0", "out of range");
  expectRefused("1e99999999999999999999999", "out of range");
  // Underflow rounds to zero, keeping the sign.
  Value tiny = parseOk("1e-400");
  EXPECT_EQ(*tiny.getDouble(), 0.0);
  Value negativeTiny = parseOk("-0." + std::string(500, '0') + "1");
  EXPECT_EQ(*negativeTiny.getDouble(), 0.0);
  EXPECT_TRUE(std::signbit(*negativeTiny.getDouble()));
  EXPECT_TRUE(parseOk("1e-99999999999999999999").isNumber());
  // A long integer literal is fine: it becomes a double.
  EXPECT_FALSE(parseOk(std::string(300, '7')).isInt());
}

TEST(JsonTest, MalformedNumbers) {
  for (const char* text : {"01", "-", "+1", "1.", ".5", "1e", "1e+", "0x10", "1.2.3", "--1", "NaN",
                           "Infinity", "-Infinity", "1 2"}) {
    expectRefused(text);
  }
}

TEST(JsonTest, ArraysAndObjectsKeepOrder) {
  Value v = parseOk(R"({"z":1,"a":[true,null,"x",{"k":[]}],"m":{}})");
  ASSERT_TRUE(v.isObject());
  const Object& members = *v.object();
  ASSERT_EQ(members.size(), 3u);
  EXPECT_EQ(members[0].first, "z");
  EXPECT_EQ(members[1].first, "a");
  EXPECT_EQ(members[2].first, "m");
  const Value* a = v.find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->isArray());
  EXPECT_EQ(a->array()->size(), 4u);
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_EQ(a->find("z"), nullptr);  // not an object
  EXPECT_EQ(serialize(v), R"({"z":1,"a":[true,null,"x",{"k":[]}],"m":{}})");
}

TEST(JsonTest, SerializeIsCompactAndRoundTrips) {
  const char* text = R"( { "a" : [ 1 , -2 , 3.5 , "s" ] , "b" : { "c" : false } } )";
  Value v = parseOk(text);
  std::string compact = serialize(v);
  EXPECT_EQ(compact, R"({"a":[1,-2,3.5,"s"],"b":{"c":false}})");
  EXPECT_EQ(parseOk(compact), v);
}

TEST(JsonTest, DoublesKeepTheirKindAndValue) {
  for (double d : {2.0, -0.0, 0.1, 1e21, 1.7976931348623157e308, 4.9e-324, -123456.789}) {
    std::string text = serialize(Value(d));
    Value back = parseOk(text);
    EXPECT_FALSE(back.isInt()) << text;
    EXPECT_EQ(*back.getDouble(), d) << text;
    EXPECT_EQ(std::signbit(*back.getDouble()), std::signbit(d)) << text;
  }
  EXPECT_EQ(serialize(Value(2.0)), "2.0");
  EXPECT_EQ(serialize(Value(std::numeric_limits<double>::infinity())), "null");
  EXPECT_EQ(serialize(Value(std::nan(""))), "null");
}

TEST(JsonTest, BuildValues) {
  Value v;
  ASSERT_NE(v.set("name", "soft_lo"), nullptr);
  v.set("port", 1);
  v.set("guid", int64_t{0x0002c9fffe000001});
  v.set("name", "soft_eth0");  // replaces in place
  Value list;
  list.push(1u);
  list.push(uint8_t{255});
  list.push(true);
  v.set("list", std::move(list));
  EXPECT_EQ(serialize(v), R"({"name":"soft_eth0","port":1,"guid":785051268677633,"list":[1,255,true]})");
  Value number(5);
  EXPECT_EQ(number.set("k", 1), nullptr);
  EXPECT_EQ(number.push(1), nullptr);
  EXPECT_EQ(number, Value(5));
}

TEST(JsonTest, AccessorsRefuseOtherKinds) {
  Value s("text");
  EXPECT_FALSE(s.getBool().isOk());
  EXPECT_FALSE(s.getInt().isOk());
  EXPECT_FALSE(s.getDouble().isOk());
  EXPECT_EQ(s.array(), nullptr);
  EXPECT_EQ(s.object(), nullptr);
  EXPECT_EQ(Value(1).getString().status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(Value(true).getInt().status().message().find("bool"), std::string::npos);
}

TEST(JsonTest, Escapes) {
  Value v = parseOk(R"("q\" b\\ s\/ \b\f\n\r\t")");
  EXPECT_EQ(*v.getString(), "q\" b\\ s/ \b\f\n\r\t");
  EXPECT_EQ(*parseOk(R"("\u0041\u00e9\u20AC")").getString(), "A\xC3\xA9\xE2\x82\xAC");
  // A surrogate pair is one code point (U+1F600), four bytes of UTF-8.
  EXPECT_EQ(*parseOk(R"("\ud83d\ude00")").getString(), "\xF0\x9F\x98\x80");
  // NUL is allowed when escaped.
  std::string nul = std::string(*parseOk(R"("a\u0000b")").getString());
  EXPECT_EQ(nul, std::string("a\0b", 3));
  // Serialize escapes what must be escaped and keeps the rest as UTF-8.
  EXPECT_EQ(serialize(Value(std::string("a\"\\\n\x01\x1f\xC3\xA9/", 9))), R"("a\"\\\n\u0001\u001f)"
                                                                          "\xC3\xA9"
                                                                          R"(/")");
  EXPECT_EQ(parseOk(serialize(Value(nul))), Value(nul));
}

TEST(JsonTest, InvalidEscapesAndStrings) {
  expectRefused(R"("\x41")", "invalid escape");
  expectRefused(R"("\u12")", "\\u");
  expectRefused(R"("\u12G4")", "hex");
  expectRefused(R"("\ud83d")", "surrogate");  // lone high surrogate
  expectRefused(R"("\ud83dx")", "surrogate");
  expectRefused(R"("\ud83d\u0041")", "surrogate");  // high followed by a non-low
  expectRefused(R"("\ude00")", "surrogate");        // lone low surrogate
  expectRefused("\"tab\there\"", "control");
  expectRefused("\"new\nline\"", "control");
  expectRefused("\"unterminated", "unterminated");
  expectRefused("\"ends in backslash\\", "unterminated");
  expectRefused("'single'");
}

TEST(JsonTest, InvalidUtf8IsRefused) {
  expectRefused("\"\xC3\"", "UTF-8");              // truncated sequence
  expectRefused("\"\xC0\xAF\"", "UTF-8");          // overlong '/'
  expectRefused("\"\xE0\x80\xAF\"", "UTF-8");      // overlong
  expectRefused("\"\xED\xA0\x80\"", "UTF-8");      // encoded surrogate
  expectRefused("\"\xF4\x90\x80\x80\"", "UTF-8");  // above U+10FFFF
  expectRefused("\"\xFF\"", "UTF-8");
  expectRefused("\"\x80\"", "UTF-8");                                           // lone continuation byte
  EXPECT_EQ(*parseOk("\"\xF4\x8F\xBF\xBF\"").getString(), "\xF4\x8F\xBF\xBF");  // U+10FFFF is fine
  // serialize() never emits invalid UTF-8: bad bytes become U+FFFD.
  std::string out =
      serialize(Value(std::string("a\xFF"
                                  "b")));
  EXPECT_EQ(out,
            "\"a\xEF\xBF\xBD"
            "b\"");
  EXPECT_TRUE(parse(out).isOk());
}

TEST(JsonTest, StructuralErrors) {
  for (const char* text :
       {"",          "   ",     "[",        "]",          "{",         "}",       "[1,]",      "[,1]",
        "[1 2]",     "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{a:1}",     "{1:1}",   "{\"a\" 1}", "[1}",
        "{\"a\":1]", "nul",     "tru",      "falsey",     "/* c */ 1", "[1] // c"}) {
    expectRefused(text);
  }
}

TEST(JsonTest, TrailingGarbageIsRefused) {
  expectRefused("{} x", "after the value");
  expectRefused("1 1", "after the value");
  expectRefused("[]]", "after the value");
  expectRefused(std::string("{}\0", 3), "after the value");
  EXPECT_TRUE(parse("{}  \n").isOk());
}

TEST(JsonTest, TruncatedDocumentsAreRefused) {
  std::string doc = R"({"sgid":"fe80::1","list":[1,2.5,"x\u00e9",{"k":null}],"b":true})";
  ASSERT_TRUE(parse(doc).isOk());
  for (size_t n = 0; n < doc.size(); ++n) {
    EXPECT_FALSE(parse(std::string_view(doc).substr(0, n)).isOk()) << "prefix of " << n << " bytes";
  }
}

TEST(JsonTest, DuplicateKeysAreRefused) {
  expectRefused(R"({"a":1,"b":2,"a":3})", "duplicate key \"a\"");
  // The key in the message comes from a peer: shortened, control characters masked.
  std::string longKey = "\"" + std::string(1000, 'k') + "\\n\"";
  Result<Value> r = parse("{" + longKey + ":1," + longKey + ":2}");
  ASSERT_FALSE(r.isOk());
  EXPECT_LT(r.status().message().size(), 200u) << r.status().message();
  expectRefused(R"({"a\nb":1,"a\nb":2})", "duplicate key \"a?b\"");
  EXPECT_TRUE(parse(R"({"a":{"a":1}})").isOk());  // the same key in different objects is fine
}

TEST(JsonTest, NestingLimit) {
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  EXPECT_TRUE(parse(nested(kMaxDepth)).isOk());
  expectRefused(nested(kMaxDepth + 1), "nesting");
  std::string objects;
  for (int i = 0; i < kMaxDepth; ++i) objects += "{\"k\":";
  objects += "0";
  objects += std::string(kMaxDepth, '}');
  EXPECT_TRUE(parse(objects).isOk());
  expectRefused("[" + objects + "]", "nesting");
  // Hostile depth: a million brackets, open or balanced, is refused without exhausting the stack.
  expectRefused(std::string(1000000, '['), "nesting");
  expectRefused(nested(1000000), "nesting");
  expectRefused(std::string(1000000, '{'));
}

TEST(JsonTest, LargeFlatDocumentsParse) {
  // Many members: the duplicate check stays fast enough for a hostile sender.
  std::string doc = "{";
  for (int i = 0; i < 100000; ++i) {
    if (i > 0) doc += ',';
    doc += "\"k" + std::to_string(i) + "\":" + std::to_string(i);
  }
  doc += "}";
  Value v = parseOk(doc);
  ASSERT_TRUE(v.isObject());
  EXPECT_EQ(v.object()->size(), 100000u);
  EXPECT_EQ(serialize(v), doc);
}

TEST(JsonTest, ErrorsNameTheOffset) {
  Result<Value> r = parse("[1, 2, x]");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("offset 7"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace ferry::json
