"""What the command-line programs under bench/ share: message sizes written the way `ferry bench
--size` takes them, and bad input answered on one line.

A size is a whole number of bytes with an optional binary suffix K, M or G in either case
(4K = 4096, 16M = 16777216), then optionally B, or after a suffix iB or b: 8, 4096, 4K, 4k, 4KB,
4KiB, 16M, 1G. Nothing else is a size: no sign, space, decimal point or other unit, no 0, nothing
above the program's largest message (1G unless it says less). These are the rules, and the
messages, of `ferry bench --size` (parseByteSize in src/common/config.cc, and the 1G limit of
ferry bench's options); bench/tests/sizes_test.py holds the two to the same answers. A list is sizes separated by commas ("8,4K,16M"), returned sorted without repeats as
`ferry bench` runs them; there are no ranges.

ArgumentParser is argparse's, except that a usage error is one line on stderr, "PROG: error:
WHAT", with exit code 2 (argparse's own error prints the usage first).

    sys.path.insert(0, <the bench directory>)
    import bench_cli
    p = bench_cli.ArgumentParser(prog="bench/compare")
    p.add_argument("--sizes", type=bench_cli.sizes_arg(), default=[8, 4096])
"""

import argparse

MAX_SIZE = 1 << 30  # kMaxMessageSize in bench/engine/bench.h
_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_UINT64_MAX = (1 << 64) - 1


class SizeError(ValueError):
    """Text that is not a size; the message is the whole explanation ("bad size 'x': ...")."""


def format_size(n):
    """8 -> "8", 4096 -> "4K", 16777216 -> "16M", 1536 -> "1536": the largest exact unit."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= (1 << shift) and n % (1 << shift) == 0:
            return "%d%s" % (n >> shift, unit)
    return str(n)


def parse_size(text, largest=MAX_SIZE):
    """The bytes `text` names; raises SizeError saying why it names none."""

    def bad(why):
        return SizeError("bad size '%s': %s" % (text, why))

    i, value = 0, 0
    while i < len(text) and "0" <= text[i] <= "9":
        if value > (_UINT64_MAX - 9) // 10:  # where ferry bench's 64-bit count stops
            raise bad("too large")
        value = value * 10 + ord(text[i]) - ord("0")
        i += 1
    if i == 0:
        raise bad("expected a number of bytes such as 4096, 4K or 1M")
    scale = 1
    if i < len(text) and text[i].lower() in _SUFFIXES:
        scale = _SUFFIXES[text[i].lower()]
        i += 1
    rest = text[i:]
    if not (rest in ("", "B") or (scale > 1 and rest in ("iB", "b"))):
        raise bad("expected a number with an optional K, M or G suffix")
    if value == 0:
        raise bad("sizes start at 1 byte")
    if value * scale > _UINT64_MAX:
        raise bad("too large")
    if value * scale > largest:
        if largest == MAX_SIZE:
            raise bad("larger than 1G, the largest message ferry bench moves")
        raise bad("larger than %s, the largest message here" % format_size(largest))
    return value * scale


def parse_sizes(text, largest=MAX_SIZE):
    """"8,4K,16M" -> [8, 4096, 16777216], sorted, each size once; an empty item is a bad size."""
    return sorted({parse_size(item, largest) for item in text.split(",")})


def size_arg(largest=MAX_SIZE):
    """An argparse `type=` for one size."""
    return _argparse_type(parse_size, largest, "size")


def sizes_arg(largest=MAX_SIZE):
    """An argparse `type=` for a comma-separated list of sizes."""
    return _argparse_type(parse_sizes, largest, "sizes")


def _argparse_type(parse, largest, name):
    def convert(text):
        try:
            return parse(text, largest)
        except SizeError as e:
            # ArgumentTypeError: argparse prints the message itself, not "invalid <name> value".
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = name
    return convert


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose usage errors are one line: "PROG: error: WHAT", exit code 2."""

    def error(self, message):
        self.exit(2, "%s: error: %s\n" % (self.prog, " ".join(message.split())))
