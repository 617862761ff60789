"""``python -m ferry.nixl.run program.py [args...]``: runs a program written for NIXL on ferry.

Installs ferry.nixl as ``nixl`` (``install_as_nixl``) and runs the program as ``__main__`` with
its own arguments, as ``python program.py args...`` would."""

import runpy
import sys

from . import install_as_nixl


def main():
    if len(sys.argv) < 2:
        sys.stderr.write("usage: python -m ferry.nixl.run program.py [args...]\n")
        return 2
    install_as_nixl()
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
