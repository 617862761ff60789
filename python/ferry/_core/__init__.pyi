"""
ferry's C++ core: verbs and endpoints
"""
from __future__ import annotations
import typing
from . import verbs
from . import endpoint
from . import agent
from . import connect
from . import objects
__all__: list[str] = ['agent', 'check_config', 'config', 'connect', 'dropped_log_lines', 'endpoint', 'forward_log', 'log', 'objects', 'verbs']
def check_config() -> None:
    """
    Raises ferry.InvalidArgument naming the first FERRY_* variable set to a value it does not take
    """
def config() -> list:
    """
    Every FERRY_* variable: name, meaning, default, valid values, and this process's setting
    """
def dropped_log_lines() -> int:
    """
    Log lines the forwarding descriptor could not take
    """
def forward_log(fd: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    Sends ferry's log lines ("LEVEL message\\n") to fd instead of stderr; -1 returns to stderr
    """
def log(level: str, message: str) -> None:
    """
    Writes one line through ferry's log (as the core does)
    """
__version__: str = '0.1.0'
