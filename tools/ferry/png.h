// A small raster canvas and PNG writer for `ferry bench --plot`: 8-bit palette images, lines,
// rectangles and a 5x7 bitmap font, encoded with a built-in deflate (fixed Huffman codes and
// run/row matches), so plotting needs no image library.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/common/status.h"

namespace ferry::cli {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

class Canvas {
 public:
  // A width x height image filled with palette entry `background`.
  Canvas(int width, int height, uint8_t background);

  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<uint8_t>& pixels() const { return pixels_; }

  // Drawing clips at the edges; colors are palette indices.
  void set(int x, int y, uint8_t color);
  void fillRect(int x, int y, int w, int h, uint8_t color);
  // A line `thickness` pixels wide from (x0, y0) to (x1, y1).
  void line(int x0, int y0, int x1, int y1, uint8_t color, int thickness = 1);
  // Text with its top-left corner at (x, y), each font pixel drawn as scale x scale. Letters are
  // drawn in capitals; characters the font lacks as '?'.
  void text(int x, int y, std::string_view s, uint8_t color, int scale = 1);
  static int textWidth(std::string_view s, int scale = 1);
  static int textHeight(int scale = 1) { return 7 * scale; }

 private:
  int width_;
  int height_;
  std::vector<uint8_t> pixels_;
};

// The PNG file of `canvas` with `palette` (at most 256 colors).
std::vector<uint8_t> encodePng(const Canvas& canvas, const std::vector<Rgb>& palette);
// encodePng() written to path; kIoError when the file cannot be written.
Status writePng(const std::string& path, const Canvas& canvas, const std::vector<Rgb>& palette);

}  // namespace ferry::cli
