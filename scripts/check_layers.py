#!/usr/bin/env python3
"""Checks that a lower layer never includes an upper one.

Reads every `#include "..."` (and `#include <ferry/...>`) in src/ and include/ferry/, finds the layer
of the including file and of the included one, and reports each include the layer table below does
not allow, as `file:line: rule`. Exits 1 if there is any, 0 otherwise.

    scripts/check_layers.py [ROOT]      ROOT: the repository (default: this script's parent's parent)

The table follows the `ferry_layer(... DEPS ...)` lines of CMakeLists.txt and the layer picture of
docs/architecture.md. A layer may include itself, the layers it names and, through them, what they
may include, with one exception: a provider's internals (src/providers/<name>/) are private to the
provider and to the provider table (src/providers/registry.cc); nothing above names a provider, so
two providers never include each other and the endpoint reaches devices only through
`ferry/devices.h`. Siblings (connect and objects, both on the agent) do not include each other.
Headers under include/ferry/ are installed without src/, so they include only `ferry/...` headers.
A file that belongs to no layer is reported too: a new folder gets a row here.
"""

import os
import re
import sys

# Each layer, lowest first: the paths that belong to it (relative to the repository root; a path
# ending in "/" is a folder and everything below it), and the layers it is built on (DEPS).
# "providers/*" rows are made from the folders under src/providers/, one per provider.
LAYERS = [
    ("common", ["src/common/", "include/ferry/common/"], []),
    ("verbs", ["src/verbs/", "include/ferry/verbs/"], ["common"]),
    ("providers/*", [], ["verbs"]),
    ("provider table", ["src/providers/registry.cc", "include/ferry/devices.h"], ["verbs", "providers/*"]),
    ("endpoint", ["src/endpoint/", "include/ferry/endpoint/"], ["verbs", "provider table"]),
    ("agent", ["src/agent/", "include/ferry/agent/"], ["endpoint"]),
    ("connect", ["src/connect/", "include/ferry/connect/"], ["agent"]),
    ("objects", ["src/objects/", "include/ferry/objects/", "include/ferry/cuobj_client.h",
                 "include/ferry/cuobj_server.h"], ["agent"]),
]

INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(ferry/[^>]+)>)')
SOURCE_SUFFIXES = (".h", ".hh", ".hpp", ".cc", ".cpp", ".c", ".inc")


class Layer:
    def __init__(self, name, paths, deps, private=False):
        self.name, self.paths, self.deps, self.private = name, paths, deps, private
        self.allowed = set()


def build_layers(root):
    providers_dir = os.path.join(root, "src", "providers")
    providers = sorted(d for d in os.listdir(providers_dir)
                       if os.path.isdir(os.path.join(providers_dir, d))) if os.path.isdir(providers_dir) else []
    layers = []
    for name, paths, deps in LAYERS:
        deps = [p for d in deps for p in (["providers/" + q for q in providers] if d == "providers/*" else [d])]
        if name == "providers/*":
            layers += [Layer("providers/" + p, ["src/providers/%s/" % p], deps, private=True) for p in providers]
        else:
            layers.append(Layer(name, paths, deps))
    by_name = {layer.name: layer for layer in layers}
    # A layer sees itself, its direct deps, and what they see, except layers private to them.
    for layer in layers:  # lowest first, so every dep's set is complete
        layer.allowed = {layer.name}
        for dep in layer.deps:
            layer.allowed.add(dep)
            layer.allowed |= {n for n in by_name[dep].allowed if not by_name[n].private}
    return layers, by_name


def layer_of(rel, layers):
    """The layer a repository-relative path belongs to (the longest matching path wins), or None."""
    best, best_len = None, -1
    for layer in layers:
        for p in layer.paths:
            if (rel == p or (p.endswith("/") and rel.startswith(p))) and len(p) > best_len:
                best, best_len = layer, len(p)
    return best


def resolve(root, including_rel, target):
    """The repository-relative file an include names, looked up as the compiler does here:
    next to the including file, then in include/, then in src/. None if it is none of ours."""
    candidates = [os.path.join(os.path.dirname(including_rel), target),
                  os.path.join("include", target), os.path.join("src", target)]
    for c in candidates:
        c = os.path.normpath(c)
        if os.path.isfile(os.path.join(root, c)):
            return c
    return None


def source_files(root):
    for top in ("src", os.path.join("include", "ferry")):
        for dirpath, dirnames, files in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for f in sorted(files):
                if f.endswith(SOURCE_SUFFIXES):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def check(root):
    layers, _ = build_layers(root)
    order = {layer.name: i for i, layer in enumerate(layers)}
    problems, files, includes = [], 0, 0
    for rel in source_files(root):
        files += 1
        rel = rel.replace(os.sep, "/")
        own = layer_of(rel, layers)
        if own is None:
            problems.append("%s:1: belongs to no layer; give its folder a row in LAYERS "
                            "(scripts/check_layers.py)" % rel)
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1) or m.group(2)
                includes += 1
                if rel.startswith("include/ferry/") and not target.startswith("ferry/"):
                    problems.append('%s:%d: includes "%s": a public header includes only ferry/... '
                                    "headers (src/ is not installed)" % (rel, lineno, target))
                    continue
                dest = resolve(root, rel, target)
                if dest is None:
                    continue  # a system or generated header; the compiler finds the missing ones
                dest = dest.replace(os.sep, "/")
                other = layer_of(dest, layers)
                if other is None or other.name in own.allowed:
                    continue
                if other.private:
                    why = "%s is private to itself and the provider table" % other.name
                elif order[other.name] > order[own.name] and own.name in other.allowed:
                    why = "%s is above %s" % (other.name, own.name)
                else:
                    why = "%s is not below %s" % (other.name, own.name)
                allowed = ", ".join(n for n in sorted(own.allowed, key=order.get))
                problems.append('%s:%d: includes "%s" (layer %s): %s; %s may include only %s'
                                % (rel, lineno, target, other.name, why, own.name, allowed))
    return problems, files, includes


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    if not os.path.isdir(os.path.join(root, "src")):
        print("check_layers: %s has no src/" % root, file=sys.stderr)
        return 2
    problems, files, includes = check(root)
    for p in problems:
        print(p)
    if problems:
        print("check_layers: %d problem(s) (%d files, %d includes read)"
              % (len(problems), files, includes))
        return 1
    print("check_layers: %d files, %d includes, every one downward or within its layer" % (files, includes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
