// Canvas and PNG writer (see png.h).
#include "png.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>

namespace ferry::cli {
namespace {

// ---- 5x7 font: seven rows of five pixels, '#' set ----
struct Glyph {
  char c;
  const char* rows[7];
};

constexpr Glyph kFont[] = {
    {' ', {".....", ".....", ".....", ".....", ".....", ".....", "....."}},
    {'0', {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."}},
    {'1', {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'2', {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"}},
    {'3', {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."}},
    {'4', {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."}},
    {'5', {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."}},
    {'6', {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."}},
    {'7', {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."}},
    {'8', {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."}},
    {'9', {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."}},
    {'A', {".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
    {'B', {"####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."}},
    {'C', {".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."}},
    {'D', {"###..", "#..#.", "#...#", "#...#", "#...#", "#..#.", "###.."}},
    {'E', {"#####", "#....", "#....", "####.", "#....", "#....", "#####"}},
    {'F', {"#####", "#....", "#....", "####.", "#....", "#....", "#...."}},
    {'G', {".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".####"}},
    {'H', {"#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
    {'I', {".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'J', {"..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."}},
    {'K', {"#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"}},
    {'L', {"#....", "#....", "#....", "#....", "#....", "#....", "#####"}},
    {'M', {"#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"}},
    {'N', {"#...#", "#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#"}},
    {'O', {".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
    {'P', {"####.", "#...#", "#...#", "####.", "#....", "#....", "#...."}},
    {'Q', {".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#"}},
    {'R', {"####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"}},
    {'S', {".####", "#....", "#....", ".###.", "....#", "....#", "####."}},
    {'T', {"#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."}},
    {'U', {"#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
    {'V', {"#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."}},
    {'W', {"#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#."}},
    {'X', {"#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"}},
    {'Y', {"#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."}},
    {'Z', {"#####", "....#", "...#.", "..#..", ".#...", "#....", "#####"}},
    {'.', {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."}},
    {',', {".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."}},
    {'-', {".....", ".....", ".....", ".###.", ".....", ".....", "....."}},
    {'/', {".....", "....#", "...#.", "..#..", ".#...", "#....", "....."}},
    {'(', {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."}},
    {')', {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."}},
    {':', {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."}},
    {'%', {"##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"}},
    {'+', {".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."}},
    {'_', {".....", ".....", ".....", ".....", ".....", ".....", "#####"}},
    {'=', {".....", ".....", "#####", ".....", "#####", ".....", "....."}},
    {'>', {".#...", "..#..", "...#.", "....#", "...#.", "..#..", ".#..."}},
    {'<', {"...#.", "..#..", ".#...", "#....", ".#...", "..#..", "...#."}},
    {'x', {".....", ".....", "#...#", ".#.#.", "..#..", ".#.#.", "#...#"}},
    {'?', {".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.."}},
};

// The glyph of c; letters are drawn as capitals. The 'x' entry is the multiplication sign, used for
// an 'x' standing alone between spaces ("2 x 3").
const Glyph& glyphFor(char c, bool times = false) {
  if (c == 'x' && !times) c = 'X';
  if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  if (times) c = 'x';
  for (const Glyph& g : kFont) {
    if (g.c == c) return g;
  }
  return kFont[sizeof kFont / sizeof kFont[0] - 1];
}

// ---- checksums ----
uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc = 0) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(const std::vector<uint8_t>& data) {
  uint32_t a = 1, b = 0;
  for (uint8_t byte : data) {
    a = (a + byte) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

// ---- deflate with the fixed Huffman codes (RFC 1951, 3.2.6) ----
class BitWriter {
 public:
  // Appends `count` bits of value, least significant first (header fields and extra bits).
  void bits(uint32_t value, int count) {
    for (int i = 0; i < count; ++i) bit((value >> i) & 1);
  }
  // Appends a Huffman code, most significant bit first.
  void code(uint32_t value, int length) {
    for (int i = length - 1; i >= 0; --i) bit((value >> i) & 1);
  }
  std::vector<uint8_t> finish() {
    if (used_ > 0) out_.push_back(current_);
    return std::move(out_);
  }

 private:
  void bit(uint32_t b) {
    current_ |= static_cast<uint8_t>(b << used_);
    if (++used_ == 8) {
      out_.push_back(current_);
      current_ = 0;
      used_ = 0;
    }
  }
  std::vector<uint8_t> out_;
  uint8_t current_ = 0;
  int used_ = 0;
};

void literalCode(BitWriter& w, uint32_t symbol) {
  if (symbol < 144) {
    w.code(0x30 + symbol, 8);
  } else if (symbol < 256) {
    w.code(0x190 + symbol - 144, 9);
  } else if (symbol < 280) {
    w.code(symbol - 256, 7);
  } else {
    w.code(0xc0 + symbol - 280, 8);
  }
}

constexpr uint16_t kLengthBase[] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                    31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr uint8_t kLengthExtra[] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                    2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr uint16_t kDistBase[] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                                  193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
constexpr uint8_t kDistExtra[] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6,
                                  6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

void match(BitWriter& w, uint32_t length, uint32_t distance) {
  int li = 28;
  while (kLengthBase[li] > length) --li;
  literalCode(w, 257 + static_cast<uint32_t>(li));
  w.bits(length - kLengthBase[li], kLengthExtra[li]);
  int di = 29;
  while (kDistBase[di] > distance) --di;
  w.code(static_cast<uint32_t>(di), 5);
  w.bits(distance - kDistBase[di], kDistExtra[di]);
}

// One fixed-Huffman block. Matches are looked for at two distances only: the previous byte (runs
// of one color) and the previous scanline (rows that repeat), which is what charts are made of.
std::vector<uint8_t> deflate(const std::vector<uint8_t>& data, size_t stride) {
  BitWriter w;
  w.bits(1, 1);  // final block
  w.bits(1, 2);  // fixed Huffman codes
  size_t i = 0;
  const size_t n = data.size();
  while (i < n) {
    uint32_t bestLength = 0, bestDistance = 0;
    for (size_t d : {size_t{1}, stride}) {
      if (d == 0 || d > i || d > 32768) continue;
      uint32_t len = 0;
      while (len < 258 && i + len < n && data[i + len] == data[i + len - d]) ++len;
      if (len > bestLength) {
        bestLength = len;
        bestDistance = static_cast<uint32_t>(d);
      }
    }
    if (bestLength >= 3) {
      match(w, bestLength, bestDistance);
      i += bestLength;
    } else {
      literalCode(w, data[i]);
      ++i;
    }
  }
  literalCode(w, 256);  // end of block
  return w.finish();
}

void put32(std::vector<uint8_t>& out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

void chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& data) {
  put32(out, static_cast<uint32_t>(data.size()));
  size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  put32(out, crc32(out.data() + start, out.size() - start));
}

}  // namespace

Canvas::Canvas(int width, int height, uint8_t background)
    : width_(width), height_(height), pixels_(static_cast<size_t>(width) * static_cast<size_t>(height), background) {}

void Canvas::set(int x, int y, uint8_t color) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  pixels_[static_cast<size_t>(y) * static_cast<size_t>(width_) + static_cast<size_t>(x)] = color;
}

void Canvas::fillRect(int x, int y, int w, int h, uint8_t color) {
  for (int yy = std::max(y, 0); yy < std::min(y + h, height_); ++yy) {
    for (int xx = std::max(x, 0); xx < std::min(x + w, width_); ++xx) set(xx, yy, color);
  }
}

void Canvas::line(int x0, int y0, int x1, int y1, uint8_t color, int thickness) {
  // Bresenham, stamping a thickness x thickness square at each step.
  int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
  int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  int half = (thickness - 1) / 2;
  while (true) {
    fillRect(x0 - half, y0 - half, thickness, thickness, color);
    if (x0 == x1 && y0 == y1) break;
    int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

void Canvas::text(int x, int y, std::string_view s, uint8_t color, int scale) {
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool times = c == 'x' && i > 0 && s[i - 1] == ' ' && i + 1 < s.size() && s[i + 1] == ' ';
    const Glyph& g = glyphFor(c, times);
    for (int row = 0; row < 7; ++row) {
      for (int col = 0; col < 5; ++col) {
        if (g.rows[row][col] == '#') fillRect(x + col * scale, y + row * scale, scale, scale, color);
      }
    }
    x += 6 * scale;
  }
}

int Canvas::textWidth(std::string_view s, int scale) {
  return s.empty() ? 0 : static_cast<int>(s.size()) * 6 * scale - scale;
}

std::vector<uint8_t> encodePng(const Canvas& canvas, const std::vector<Rgb>& palette) {
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  put32(ihdr, static_cast<uint32_t>(canvas.width()));
  put32(ihdr, static_cast<uint32_t>(canvas.height()));
  ihdr.insert(ihdr.end(), {8, 3, 0, 0, 0});  // 8 bits per pixel, palette, deflate, no filter, no interlace
  chunk(out, "IHDR", ihdr);
  std::vector<uint8_t> plte;
  for (size_t i = 0; i < std::min<size_t>(palette.size(), 256); ++i) {
    plte.insert(plte.end(), {palette[i].r, palette[i].g, palette[i].b});
  }
  chunk(out, "PLTE", plte);
  // Scanlines, each with filter type 0 in front.
  const size_t width = static_cast<size_t>(canvas.width());
  std::vector<uint8_t> raw;
  raw.reserve((width + 1) * static_cast<size_t>(canvas.height()));
  for (int y = 0; y < canvas.height(); ++y) {
    raw.push_back(0);
    auto row = canvas.pixels().begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(y) * width);
    raw.insert(raw.end(), row, row + static_cast<std::ptrdiff_t>(width));
  }
  std::vector<uint8_t> z = {0x78, 0x01};  // zlib header: deflate, 32 KiB window
  std::vector<uint8_t> body = deflate(raw, width + 1);
  z.insert(z.end(), body.begin(), body.end());
  put32(z, adler32(raw));
  chunk(out, "IDAT", z);
  chunk(out, "IEND", {});
  return out;
}

Status writePng(const std::string& path, const Canvas& canvas, const std::vector<Rgb>& palette) {
  std::vector<uint8_t> bytes = encodePng(canvas, palette);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return ioError("cannot write " + path);
  size_t n = std::fwrite(bytes.data(), 1, bytes.size(), f);
  int closed = std::fclose(f);
  if (n != bytes.size() || closed != 0) return ioError("cannot write " + path);
  return Status::ok();
}

}  // namespace ferry::cli
