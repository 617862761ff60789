// Feeds arbitrary bytes, cut into arbitrary pieces, to the line framer every line protocol reads
// peer input through (common/net/line_connection.h), once skipping empty lines and once handing
// them out. Whatever the cuts, the lines it hands out are the stream's newline-terminated lines in
// order (the non-empty ones only, when it skips), none longer than the bound plus the piece that
// completed it (the unfinished line never passes the bound unnoticed), hasLine() says beforehand
// whether next() hands out a line, and it says the stream is over the bound exactly when the
// unfinished line is, whose length unfinished() gives.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/net/line_connection.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "line_framer_fuzz: %s\n", what);
    std::abort();
  }
}

// One pass over the stream with the framer skipping or handing out empty lines.
void checkFraming(std::string_view stream, size_t maxLine, size_t cut,
                  ferry::net::LineFramer::EmptyLines empty) {
  const bool skipEmpty = empty == ferry::net::LineFramer::EmptyLines::kSkip;
  ferry::net::LineFramer framer(maxLine, empty);
  std::vector<std::string> got;
  size_t fed = 0;
  bool over = false;
  for (size_t at = 0, piece = cut; at < stream.size() && !over; at += piece, piece = piece % 31 + 1) {
    std::string_view bytes = stream.substr(at, piece);
    framer.feed(bytes);
    fed = at + bytes.size();
    for (;;) {
      const bool promised = framer.hasLine();
      auto line = framer.next();
      check(promised == line.has_value(), "hasLine() disagrees with next()");
      if (!line) break;
      check(!skipEmpty || !line->empty(), "an empty line was handed out");
      check(line->find('\n') == std::string_view::npos, "a line holds a newline");
      check(line->size() <= maxLine + bytes.size(), "a line grew past the bound unnoticed");
      got.emplace_back(*line);
    }
    over = framer.overLimit();
  }

  // What the stream fed so far holds: its whole lines, then the unfinished rest.
  std::string_view seen = stream.substr(0, fed);
  std::vector<std::string> want;
  size_t start = 0;
  for (size_t nl; (nl = seen.find('\n', start)) != std::string_view::npos; start = nl + 1) {
    if (nl > start || !skipEmpty) want.emplace_back(seen.substr(start, nl - start));
  }
  check(got == want, "the lines differ from the stream's");
  check(over == (seen.size() - start > maxLine), "overLimit() disagrees with the unfinished line");
  check(framer.unfinished() == seen.size() - start, "unfinished() disagrees with the unfinished line");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // The first byte sets the bound (1..256), the second how the rest is cut (piece lengths cycle).
  const size_t maxLine = size_t{data[0]} + 1;
  const size_t cut = static_cast<size_t>(data[1] % 31) + 1;
  std::string_view stream(reinterpret_cast<const char*>(data) + 2, size - 2);
  checkFraming(stream, maxLine, cut, ferry::net::LineFramer::EmptyLines::kSkip);
  checkFraming(stream, maxLine, cut, ferry::net::LineFramer::EmptyLines::kHandOut);
  return 0;
}
