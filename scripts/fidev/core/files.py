"""Reading large files (multi-GB wheels, the source release) in bounded memory, and writing a
download so that nothing unverified is ever left where it is used. A file is written through a
temporary file renamed into place, so an output that exists and is not a regular file (a FIFO, a
device such as /dev/full, a folder) is refused, never replaced; a tool checks the outputs it is
named (output_file, output_folder) before its work. And reading what our processes and the user hand
us (records, manifests) in bounded measure: a regular file only (a FIFO would hang a reader, /dev/zero
never end), up to MAX_INPUT_BYTES, and JSON nested no deeper than the parser's recursion allows."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import math
import os
import stat
import sys
import tempfile
import threading
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fidev.core import shown
from fidev.core.failure import Failure

CHUNK = 1 << 20
MAX_INPUT_BYTES = 256 << 20  # the largest record or manifest a reader takes: ours are far smaller


def read_input(path: str | Path, limit: int = MAX_INPUT_BYTES) -> bytes:
    """A regular file's bytes. ValueError where it is no regular file (a FIFO, whose reading would wait
    for a writer; a device such as /dev/zero, which never ends; a folder) or holds more than `limit`
    bytes; OSError where it cannot be opened (FileNotFoundError where it is missing)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError(f"{path} is not a regular file")
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} holds more than {limit >> 20} MiB")
    return data


def parse_json(text: str | bytes):
    """json.loads, where nesting too deep for the parser (RecursionError) is a ValueError like any other bad JSON,
    and bytes that are not UTF-8 (what every writer of ours and FlashInfer's JIT report write) are said so."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")  # a BOM, as json.loads takes bytes
        except UnicodeDecodeError as e:
            raise ValueError(f"it is not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("it is nested too deeply to be JSON of ours") from None


def load_json(path: str | Path):
    """A JSON file read as read_input reads it; ValueError for bad JSON and for no regular file, OSError as open's."""
    return parse_json(read_input(path))


@dataclasses.dataclass(frozen=True)
class MayLack:
    """A field of a record (fits' {"field": shape}) that may be missing: an older writer left it out."""

    shape: object


def fits(value, shape) -> bool:
    """Whether `value`, JSON read back, has `shape`, so that its reader may take it as written: None;
    a type (int is no bool; float is a finite number, an int too: `finite`; dict and list: any); list[X],
    dict[str, X] and X | Y;
    a dataclass (its fields by their annotations, those with a default may be missing, no others);
    {"field": shape, ...} (an object with those fields, MayLack(shape) where one may be missing, others
    not looked at); or a predicate (is_fact). Each reader states its record's shape once, beside it."""
    if shape is None or shape is type(None):
        return value is None
    if shape is float:
        return finite(value)
    if isinstance(shape, type) and not dataclasses.is_dataclass(shape):
        return type(value) is shape
    origin, args = typing.get_origin(shape), typing.get_args(shape)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin in (list, dict):
        return type(value) is origin and all(fits(v, args[-1]) for v in (value.values() if origin is dict else value))
    if dataclasses.is_dataclass(shape):
        hints, fields = typing.get_type_hints(shape), dataclasses.fields(shape)
        missing = (dataclasses.MISSING, dataclasses.MISSING)
        defaults = {f.name for f in fields if (f.default, f.default_factory) != missing}
        record = {f.name: MayLack(hints[f.name]) if f.name in defaults else hints[f.name] for f in fields}
        return type(value) is dict and set(value) <= set(record) and fits(value, record)
    if isinstance(shape, dict):
        return type(value) is dict and all(
            fits(value[k], s.shape if isinstance(s, MayLack) else s) if k in value else isinstance(s, MayLack)
            for k, s in shape.items()
        )
    return bool(shape(value))


def finite(value) -> bool:
    """Whether `value`, JSON read back, is a number a float holds, to be taken as one: json reads NaN and
    (-)Infinity, which no writer of ours writes and no time or measure is, and a whole number of any size
    (10**400), which float() then refuses (OverflowError) and which compares below infinity all the same."""
    if type(value) is int:
        return -sys.float_info.max <= value <= sys.float_info.max  # compared exactly, never made a float
    return type(value) is float and math.isfinite(value)


MOST_COUNTED = 10**9  # a count a record keeps (test cases, files): far past any suite's, far below a typo's


def count(value) -> bool:
    """Whether `value`, JSON read back, is a count as our writers write one: a whole number from 0 to
    MOST_COUNTED (a fits shape: -5, 10**400 or 1.5 cases are no count)."""
    return type(value) is int and 0 <= value <= MOST_COUNTED


def read_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    for chunk in read_chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def file_fact(path: str | Path) -> list | None:
    """[mtime_ns, size, sha256] of a file: what the workspace records of a build's inputs and of the
    source release's files, to tell an edit later (`differs`); None where it cannot be read."""
    try:
        st = os.stat(path)
        return [st.st_mtime_ns, st.st_size, sha256_file(Path(path))]
    except OSError:
        return None


def is_fact(value) -> bool:
    """Whether `value` has file_fact's shape, as a record read back holds it: None, or [mtime_ns,
    size] with the sha256 or None after them (an input saved while its build ran)."""
    return value is None or (
        isinstance(value, list)
        and len(value) in (2, 3)
        and all(type(n) is int for n in value[:2])
        and (len(value) == 2 or value[2] is None or isinstance(value[2], str))
    )


def differs(path: str | Path, recorded: list | None) -> bool:
    """Whether the file's content is not what `recorded` (file_fact's list) says. It is hashed again
    only where its mtime or size moved, so a touched file of the same content does not differ; a
    missing or unreadable file, or a record without a hash whose stat moved, does."""
    try:
        st = os.stat(path)
    except OSError:
        return True
    if recorded is None:
        return True
    if [st.st_mtime_ns, st.st_size] == list(recorded[:2]):
        return False
    try:
        return len(recorded) < 3 or sha256_file(Path(path)) != recorded[2]
    except OSError:
        return True


# What a path that exists and is no regular file is, as said (stat's file types)
KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


def kind_of(mode: int, otherwise: str) -> str:
    """What a stat mode's file type is, as said after "is" ("a named pipe (FIFO)": KINDS), else
    `otherwise`, in the words its message needs: a regular file is "a file" where a folder was named,
    "no regular file" where an unknown type is said (one table, so that every message names a type alike)."""
    return KINDS.get(stat.S_IFMT(mode), otherwise)


def _mode(path: str | Path) -> int | str:
    """The path's stat mode (through its links), or why it has none, as said after its name."""
    try:
        return os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "does not exist"
    except OSError as e:
        return f"cannot be reached ({e.strerror or e})"


def not_a_file(path: str | Path) -> str | None:
    """Why `path`, named as a file to read (an archive, a wheel), is none, as said after its name: it
    does not exist, is a folder, or is a named pipe, a device... (not "does not exist": it does); None
    where it is a regular file."""
    mode = _mode(path)
    if isinstance(mode, str):
        return mode
    if stat.S_ISREG(mode):
        return None
    kind = kind_of(mode, "no regular file")
    return "is a folder" if stat.S_ISDIR(mode) else f"is {kind}, not a regular file"


def not_a_folder(path: str | Path) -> str | None:
    """Why `path`, named as a folder to read, is none, as not_a_file says it ("is a file, not a folder"
    for a regular file); None where it is a folder."""
    mode = _mode(path)
    if isinstance(mode, str):
        return mode
    if stat.S_ISDIR(mode):
        return None
    kind = kind_of(mode, "no folder")
    return "is a file, not a folder" if stat.S_ISREG(mode) else f"is {kind}, not a folder"


def replaceable(path: Path) -> None:
    """Two lines where `path` exists (through its links) and is not a regular file: writing it by a
    rename into place would replace that special file (a FIFO, /dev/full, a folder) with a regular one."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing, or a way there that is no folder: the folder's own check says which
        return
    if not stat.S_ISREG(mode):
        kind = kind_of(mode, "not a regular file")
        raise Failure(
            f"{path} exists and is {kind}, not a regular file: it would be replaced, not written",
            "name a regular file, or a path where nothing is yet",
        )


def cannot_write_in(folder: Path) -> str | None:
    """Why a file cannot be made in `folder` (an existing folder), tried by making one and removing it: access()
    says yes to root in /proc and /sys, and to anyone on a file system mounted read-only since; None where it can."""
    try:
        handle, probe = tempfile.mkstemp(prefix=".fidev-probe-", dir=folder)
    except OSError as e:
        return e.strerror or str(e)
    os.close(handle)
    os.unlink(probe)
    return None


def writable_folder(folder: Path, what: str) -> None:
    """Two lines where `folder`, or the nearest folder above it that exists (a write makes the rest),
    is no folder or cannot be written in."""
    folder = Path(os.path.abspath(folder))
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise Failure(f"{what}: {folder} is not a folder", "name a path whose folders are folders")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise Failure(f"{what}: the folder {folder} is read-only here", "name a path in a folder you can write")
    if why := cannot_write_in(folder):
        raise Failure(
            f"{what}: nothing can be made in the folder {folder} ({why})", "name a path in a folder you can write"
        )


def output_file(text: str) -> Path:
    """A file a tool is named to write (--summary, --record), checked before the work that fills it:
    user_path's checks, then two lines where it ends in / (or /., /..: a folder's name, whether it exists or
    not, which Path() would read as the file without the /), exists and is not a regular file, or its folder
    is none or read-only, or the temporary file its write goes through (write_whole) would be past PATH_MAX."""
    if text == "-":
        raise Failure("- names standard output, and this writes a file", "name a file (./- for a file named -)")
    if text.endswith(("/", "/.", "/..")) or text in (".", ".."):
        raise Failure(
            f"{text} names a folder (it ends in /, . or ..), and this writes a file",
            "name the file itself: a file name in that folder",
        )
    path = user_path(text)
    replaceable(path)
    writable_folder(path.parent, f"{path} cannot be written")
    tmp = temporary_beside(Path(os.path.realpath(path)), LONGEST_TAG)
    if len(os.fsencode(tmp)) >= PATH_MAX:
        raise Failure(
            f"{path} cannot be written: the temporary file its write goes through, beside it, would be "
            f"{len(os.fsencode(tmp))} bytes long, past the system's limit of {PATH_MAX}",
            "name a shorter path, or one in a folder nearer /",
        )
    return path


def input_folder(text: str) -> Path:
    """A folder a tool is named to read (an argparse type, through fidev.core.failure.option): user_path's
    checks, then two lines where it is missing or no folder, said for what it is (a named pipe, a file)."""
    path = user_path(text)
    if why := not_a_folder(path):
        raise Failure(f"{path} {why}", "name the folder itself")
    return path


def output_folder(text: str) -> Path:
    """A folder a tool is named to write in (made where missing), checked before its work: two
    lines where the path is something else, or it cannot be written in."""
    path = user_path(text)
    if path.exists() and not path.is_dir():
        kind = kind_of(os.stat(path).st_mode, "a file")
        raise Failure(f"{path} is {kind}, not a folder", "name a folder, or a path where nothing is yet")
    writable_folder(path, f"{path} cannot be written in")
    return path


def write_verified(target: Path, chunks: Iterable[bytes], sha256: str, mismatch: Callable[[str], Exception]) -> int:
    """Stream `chunks` into `<target>.tmp-<pid>`, hashing on the way, and rename it to `target`
    only if its SHA-256 is `sha256`; else raise mismatch(actual). Whatever stops it (a failed
    download, Ctrl-C), the temporary file is removed and `target` is untouched; a target that is not
    a regular file is refused first (replaceable). Returns the size."""
    replaceable(target)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    digest, size = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        if digest.hexdigest() != sha256:
            raise mismatch(digest.hexdigest())
        os.replace(tmp, target)
        return size
    finally:
        tmp.unlink(missing_ok=True)


NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits on a path's part and on the whole path, in bytes
LONGEST_TAG = f"{'9' * 7}-{'9' * 20}"  # write_whole's tag at its longest: a pid (pid_max 2**22), a thread id


def user_path(text: str) -> Path:
    """A path named on a command line, refused where no file system could take it: empty, longer
    than PATH_MAX, a part longer than NAME_MAX, or through a symbolic link that loops. Whether it
    exists, and is what its option wants, is each option's own check. Spaces and any Unicode are fine; a
    path that starts with - is refused (./-x names that file)."""
    if not text.strip():
        raise Failure("the path is empty", "name a file or folder")
    if text.startswith("-"):  # `--summary=--x`: an option where a path was meant, as `--summary --x` is refused
        raise Failure(f"the path {text} starts with -, as an option does", f"a file of that name: ./{text}")
    if len(os.fsencode(text)) >= PATH_MAX:
        raise Failure(
            f"the path is {len(os.fsencode(text))} bytes long, past the system's limit of {PATH_MAX}",
            "name a shorter path",
        )
    long = next((part for part in Path(text).parts if len(os.fsencode(part)) > NAME_MAX), None)
    if long is not None:
        raise Failure(
            f"a part of the path is {len(os.fsencode(long))} bytes long, past the file system's limit of {NAME_MAX} "
            f"({long[:24]}...)",
            "name a path whose every folder and file name is shorter",
        )
    try:
        os.stat(text)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Failure(
                f"{text}: a symbolic link on the way loops",
                "fix or remove the looping link (ls -l each folder of the path)",
            ) from None
    return Path(text)


def temporary_beside(path: Path, tag: str) -> Path:
    """The temporary file a write of `path` goes through before its rename into place: `.<name>.tmp-<tag>` in
    its folder. A name that user_path takes (up to NAME_MAX bytes) would pass NAME_MAX with those 30-odd bytes
    added, and the write fail only at the run's end: there the name in it is cut short, by whole characters,
    so that it fits; the tag (the writer's own: its pid and thread) keeps it apart from another writer's."""
    suffix = f".tmp-{tag}"
    room = NAME_MAX - len(os.fsencode(f".{suffix}"))
    name = path.name
    while len(os.fsencode(name)) > room:
        name = name[:-1]
    return path.with_name(f".{name}{suffix}")


def write_whole(path: Path, text: str) -> None:
    """`text` into `path`, whole or not at all: a temporary file beside it (temporary_beside), renamed into
    place (one per process and thread, so that writers of one path in threads of one process do not share it).
    A path through a link is written where the link leads (the link stays); one that exists and is
    not a regular file is refused in two lines, never replaced (replaceable). Written as UTF-8, a byte of a
    path that is none shown as `\\xff` (fidev.core.shown)."""
    path = Path(os.path.realpath(path))
    replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_beside(path, f"{os.getpid()}-{threading.get_ident()}")
    try:
        tmp.write_text(text, encoding="utf-8", errors=shown.BYTES)  # a path's byte that is no UTF-8: \xff
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


OUTPUT_FIX = "name a path on a file system you can write, with room left on it (`df -h` of its folder)"


def write_output(path: Path, text: str, what: str, ended: str = "", exit_status: int = 1) -> None:
    """write_whole of a file the user named (--summary, --record) at a run's end, where the check made
    before the run (output_file) can still be passed and the write fail (a file system that refuses
    it, full, or read-only since): two lines naming the path and the OS error, never a traceback.
    `ended`: how the run itself ended, said with it (its own failure would be lost otherwise), and
    `exit_status` its status, which the failed write does not turn into 0."""
    try:
        write_whole(path, text)
    except OSError as e:
        raise Failure(
            f"{what} {path} could not be written: {e.strerror or e}{f'; {ended}' if ended else ''}",
            OUTPUT_FIX,
            exit_status=exit_status or 1,
        ) from e


def read_record(path: Path, schema: str, what: str, fix: str) -> dict:
    """A JSON record our processes pass each other, without its "schema" field; two lines (`what`
    names the writer's record) where it is missing, cannot be read, or is of another schema."""
    try:
        data = load_json(path)
    except FileNotFoundError:
        raise Failure(f"{what} is missing: {path}", fix) from None
    except (OSError, ValueError) as e:
        raise Failure(f"{what} {path} cannot be read ({e})", fix) from None
    if not isinstance(data, dict) or data.get("schema") != schema:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise Failure(f"{path} is not {what} of schema {schema} (it says {found!r})", fix)
    data.pop("schema")
    return data


@contextmanager
def exclusive(lock_path: Path, who: str, busy: Failure, unwritable: Callable[[OSError], Failure]) -> Iterator[None]:
    """An exclusive lock on `lock_path` (fcntl.flock: the kernel lets it go when the process ends,
    however it ends) for the block, held by `who`; `busy` (its problem formatted with who holds it)
    where another process holds it, `unwritable(error)` where the file cannot be opened. The file is
    removed while still held, so nothing is left behind; a process that locked a file already removed
    (it opened it just before) finds the path gone or another file there, and is refused too."""
    try:
        handle = open(lock_path, "a+")
    except OSError as e:
        raise unwritable(e) from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise Failure(
                busy.problem.format(handle.read().strip() or "another process"), busy.fix, exit_status=busy.exit_status
            ) from None
        try:
            current = os.stat(lock_path).st_ino
        except FileNotFoundError:
            current = None
        if current != os.fstat(handle.fileno()).st_ino:  # its holder removed it as we opened it: it was busy
            raise Failure(busy.problem.format("a process that just finished"), busy.fix, exit_status=busy.exit_status)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{who}, pid {os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            lock_path.unlink(missing_ok=True)
            fcntl.flock(handle, fcntl.LOCK_UN)


def folder_size(folder: Path) -> tuple[int, int]:
    """(how many entries `folder` holds, their bytes), from one listing: an entry gone between the listing
    and its size (another process's temporary file, renamed in place) is not counted."""
    files, size = 0, 0
    for path in folder.iterdir():
        try:
            size += path.stat().st_size
        except FileNotFoundError:
            continue
        files += 1
    return files, size


def missing_folders(folder: Path) -> list[Path]:
    """`folder` and the folders above it that do not exist yet, deepest first: what a `mkdir -p` of it
    would make, for remove_empty to take back where the run then fails."""
    missing, at = [], Path(os.path.abspath(folder))
    while not os.path.lexists(at) and at != at.parent:
        missing.append(at)
        at = at.parent
    return missing


def remove_empty(folders: list[Path]) -> None:
    """The folders (deepest first: missing_folders') removed where still empty: a run that ends in its two
    lines leaves no folder it made for nothing. One that holds something now stops it, left as it is."""
    for made in folders:
        try:
            made.rmdir()
        except OSError:
            return
