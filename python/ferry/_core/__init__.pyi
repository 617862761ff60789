"""
ferry's C++ core: verbs and endpoints
"""
from __future__ import annotations
import typing
from . import verbs
from . import verbs_constants
from . import endpoint
from . import agent
from . import connect
from . import objects
__all__: list[str] = ['agent', 'agent_secret', 'check_config', 'config', 'connect', 'cuda', 'dropped_log_lines', 'endpoint', 'forward_log', 'log', 'log_level', 'objects', 'set_log_level', 'unknown_config', 'verbs', 'verbs_constants']
def agent_secret() -> bytes:
    """
    FERRY_AGENT_SECRET's value (b'' when unset), for Python layers that authenticate their own frames
    """
def check_config() -> None:
    """
    Raises ferry.InvalidArgument naming the first FERRY_* variable set to a value it does not take
    """
def config() -> list:
    """
    Every FERRY_* variable: name, meaning, default, valid values, and this process's setting
    """
def cuda() -> dict:
    """
    CUDA's driver as ferry loaded it, as `ferry info --json` shows it: usable (bool: CUDA memory registers and moves), reason (why not; '' when usable), library (what was loaded or tried), driver_version (1000 * major + 10 * minor; 0 when unknown), devices (the CUDA devices seen)
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
def log_level() -> str:
    """
    The threshold of ferry's log: 'error', 'warn', 'info' or 'debug'
    """
def set_log_level(level: str) -> None:
    """
    Sets the threshold of ferry's log: 'error', 'warn', 'info' or 'debug'
    """
def unknown_config() -> list:
    """
    The FERRY_* variables set here that ferry does not read: name, suggestion, warning
    """
__version__: str = '0.1.0'
