"""Write one module of the greet package, as a builder would: `add_module.py NAME`.

`shout` announces its result with print() (the call the plan forbids); `whisper` only returns it.
"""

import sys
from pathlib import Path

MODULES = {
    "shout": '''"""Shouted greetings."""

from greet import hello


def shout(name: str) -> str:
    """Return the greeting in capitals."""
    text = hello(name).upper()
    print(text)
    return text
''',
    "whisper": '''"""Whispered greetings."""

from greet import hello


def whisper(name: str) -> str:
    """Return the greeting in lower case, without the exclamation mark."""
    return hello(name).lower().rstrip("!")
''',
}

name = sys.argv[1]
Path("greet", f"{name}.py").write_text(MODULES[name], encoding="utf-8")
