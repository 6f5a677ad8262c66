r"""How our output shows what the system gave us as bytes that are not UTF-8 (a path named with b'\xff', an
argument, an environment value): Python holds each such byte as a lone surrogate (os.fsdecode's
surrogateescape, U+DC80-U+DCFF), which stderr printed as `\udcff` and a strict stdout (a UTF-8 locale's)
refused with a traceback. Written through BYTES, each is shown as the byte it stands for, `\xff`; any other
character a stream cannot encode, as backslashreplace shows it."""

from __future__ import annotations

import codecs
import sys

BYTES = "fidev-bytes"  # the error handler's name, for str.encode and a stream's errors


def _as_bytes(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    shown = []
    for char in error.object[error.start : error.end]:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for the byte code - 0xDC00
            shown.append(f"\\x{code - 0xDC00:02x}")
        else:
            shown.append(char.encode("ascii", "backslashreplace").decode("ascii"))
    return "".join(shown), error.end


codecs.register_error(BYTES, _as_bytes)


def printable(text: str) -> str:
    """`text` with each character that is no printable one (a line break, a tab, NUL, an escape, a byte that
    is not UTF-8) written as Python writes it in a string (`\\n`, `\\x00`, `\\u2028`; such a byte `\\xff`):
    a name or path quoted in a one-line message stays one line, and puts nothing raw on the terminal."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def _escaped(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for a byte
        return f"\\x{code - 0xDC00:02x}"
    return char.encode("unicode_escape").decode("ascii")


def show_bytes_readably() -> None:
    """stderr, and a stdout that would refuse them (errors strict), write such bytes through BYTES. A
    stdout that writes them back as they were (surrogateescape: Python's choice in the C locale) keeps
    doing so, for a reader that takes the path it prints."""
    for stream, replaced in ((sys.stderr, ("strict", "backslashreplace")), (sys.stdout, ("strict",))):
        if getattr(stream, "errors", None) in replaced and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors=BYTES)
