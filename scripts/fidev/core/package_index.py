"""Package indexes and downloads: the user's pip index configuration, PEP 691 (JSON) and PEP 503
(HTML) project pages, and downloads that fail in two lines (unreachable, HTTP error, stalled,
cut short) instead of a traceback. Standard library only."""

from __future__ import annotations

import ast
import email.utils
import http.client
import mimetypes
import os
import re
import ssl
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import urllib.response
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from fidev.core.failure import Failure
from fidev.core.files import CHUNK, MayLack, fits, kind_of, not_a_file, parse_json
from fidev.core.numbers import whole

PYPI_SIMPLE = "https://pypi.org/simple"
PIP_CONFIG_TIMEOUT_S = 30
PROGRESS_EVERY_S = 10


def url(text: str) -> str:
    """A URL as the scripts' options take it (an argparse type, through fidev.core.failure.option): http(s)
    with a host, or file on this host; ASCII without spaces or control characters, as a URL is written."""
    if not text.isascii():
        raise Failure(
            f"{text!r} is not a URL: it holds characters that are not ASCII",
            "percent-encode them as UTF-8 (é is %C3%A9), as a URL writes them",
        )
    if any(c.isspace() or not c.isprintable() for c in text):
        raise Failure(
            f"{text!r} is not a URL: it holds a space or a control character",
            "percent-encode it (a space is %20), or give the URL without it",
        )
    parts = urllib.parse.urlparse(text)
    if parts.scheme not in ("http", "https", "file"):
        raise Failure(f"{text!r} is not an http(s) or file URL", "write it with its scheme: https://...")
    if parts.scheme == "file":
        _file_url(text, parts)
        return text
    if not parts.hostname:
        raise Failure(f"{text!r} names no host", "write the whole URL: https://host/path")
    try:
        port = parts.port
    except ValueError:  # not digits (`h:abc`), or past 65535
        port = 0
    if port == 0:
        raise Failure(
            f"{text!r} names no port from 1 to 65535", "write the port as a number from 1 to 65535, or leave it out"
        )
    return text


def _file_url(text: str, parts: urllib.parse.ParseResult) -> None:
    """url's rules for a file URL: written file://[localhost]/path (`file:/path` is left to no reader's
    leniency), of a file on this host, whose path can be one (no NUL byte: `%00`)."""
    if not text.partition(":")[2].startswith("//"):
        raise Failure(f"{text!r} is a file URL without //", "write it as file:///path (three slashes)")
    if parts.netloc not in ("", "localhost"):
        raise Failure(f"{text!r} names a file on another host", "write a file on this host: file:///path")
    if "\0" in local_path(text):
        raise Failure(
            f"{text!r} names a path holding a NUL byte (%00), which no file's path can hold",
            "give the URL of the file itself, without %00",
        )


def local_path(text: str) -> str:
    """The path a file URL names on this host: its %XX bytes as the file system takes them, as os.fsdecode
    does (%ff is the byte 0xff, shown as `\\xff`: fidev.core.shown), not read as UTF-8 with U+FFFD in place of
    what is none (urllib's url2pathname)."""
    return urllib.parse.unquote(urllib.parse.urlparse(text).path, errors="surrogateescape")


def normalize(name: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class PipSettings:
    """What `pip download` would use: index-url, extra-index-url, find-links, no-index, cert,
    proxy, timeout."""

    index_url: str = PYPI_SIMPLE
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    cert: str | None = None
    proxy: str | None = None
    timeout: float = 15

    @property
    def indexes(self) -> tuple[str, ...]:
        return () if self.no_index else (self.index_url, *self.extra_index_urls)

    def describe(self) -> str:
        return ", ".join([*self.indexes, *(f"find-links {f}" for f in self.find_links)]) or "no index (no-index is set)"


def _config_values(python: str) -> dict[str, str]:
    """`pip config list` prints the merged pip.conf values as `section.key='value'`, and the PIP_*
    variables as `:env:.key='value'`. Without pip, the PIP_* variables alone."""
    try:
        done = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=PIP_CONFIG_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        done = None
    if done is None or done.returncode != 0:
        return {f":env:.{k[4:].lower().replace('_', '-')}": v for k, v in os.environ.items() if k.startswith("PIP_")}
    values = {}
    for line in done.stdout.splitlines():
        name, _, quoted = line.partition("=")
        try:
            values[name] = ast.literal_eval(quoted)
        except (ValueError, SyntaxError):
            continue
    return values


def pip_settings(python: str = sys.executable) -> PipSettings:
    """The user's index configuration: a PIP_* variable wins over the `download` section, which
    wins over `global` (pip's own precedence for `pip download`)."""
    values = _config_values(python)

    def get(key: str) -> str | None:
        for section in (":env:", "download", "global"):
            if f"{section}.{key}" in values:
                return values[f"{section}.{key}"]
        return None

    timeout = get("timeout") or get("default-timeout")
    return PipSettings(
        index_url=get("index-url") or PYPI_SIMPLE,
        extra_index_urls=tuple((get("extra-index-url") or "").split()),
        find_links=tuple((get("find-links") or "").split()),
        no_index=(get("no-index") or "").lower() in ("1", "true", "yes", "on"),
        cert=get("cert"),
        proxy=get("proxy"),
        timeout=float(timeout) if timeout else 15,
    )


class HttpStatus(Failure):
    """A server that answered with an HTTP error status: callers tell a missing page (404) from
    an unreachable index by `status`, not by the message."""

    def __init__(self, problem: str, fix: str, status: int):
        super().__init__(problem, fix)
        self.status = status


def _opener(settings: PipSettings | None) -> urllib.request.OpenerDirector:
    handlers: list = []
    if settings and settings.proxy:
        handlers.append(urllib.request.ProxyHandler({"http": settings.proxy, "https": settings.proxy}))
    if settings and settings.cert:
        handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=settings.cert)))
    return urllib.request.build_opener(*handlers)  # otherwise urllib's own: http(s)_proxy, no_proxy, system CAs


def open_url(
    url: str,
    settings: PipSettings | None = None,
    timeout: float = 60,
    accept: str | None = None,
    fix: str = "check the network (or proxy)",
):
    """The response, or a Failure naming what went wrong: an HTTP status, or the connection. A file://
    URL opens a regular file only (open_local)."""
    if urllib.parse.urlparse(url).scheme == "file":
        return open_local(url, fix)
    try:
        request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
        return _opener(settings).open(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise HttpStatus(f"{url} answered {e.code} {e.reason}", fix, e.code) from e
    except ValueError as e:  # no scheme, or one urllib does not know
        raise Failure(
            f"{url!r} is not a URL urllib can open: {e}",
            "write it with its scheme: https://..., http://... or file://...",
        ) from e
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise Failure(f"cannot reach {url}: {getattr(e, 'reason', e)}", fix) from e


def open_local(url: str, fix: str):
    """A file:// URL's response, as urllib's own gives it, but of a regular file only: a named pipe would wait
    for a writer, a device such as /dev/zero never ends, a folder is no file; each fails in two lines, before
    a byte is read. The check is of the file opened (without waiting), so nothing can swap it in between."""
    parts = urllib.parse.urlparse(url)
    if parts.netloc not in ("", "localhost"):
        raise Failure(f"{url} names a file on another host", fix)
    path = local_path(url)
    if why := not_a_file(path):  # said for what it is, before it is opened
        raise Failure(f"{url}: {path} {why}", fix)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise Failure(f"cannot reach {url}: {e.strerror or e}", fix) from e
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise Failure(f"{url}: {path} is {kind_of(st.st_mode, 'no regular file')}", fix)
    os.set_blocking(fd, True)
    headers = email.message_from_string(
        f"Content-type: {mimetypes.guess_type(path)[0] or 'text/plain'}\nContent-length: {st.st_size}\n"
        f"Last-modified: {email.utils.formatdate(st.st_mtime, usegmt=True)}\n"
    )
    return urllib.response.addinfourl(os.fdopen(fd, "rb"), headers, url)


def read_chunks(
    response,
    url: str,
    stall_s: float,
    progress: Callable[[int, int | None], None] = lambda done, total: None,
    limit: int | None = None,
) -> Iterator[bytes]:
    """The body in chunks. A read that waits `stall_s` (the timeout the response was opened
    with) is a stall, and a body shorter than its Content-Length is cut short: both fail in two
    lines, as does a connection that breaks. A body of more than `limit` bytes fails too: at once
    where its Content-Length says so, else as soon as that much has come."""
    total = response.headers.get("Content-Length")
    total = whole(total) if total else None  # '²' passes str.isdigit, not int(); thousands of digits neither
    if limit is not None and total is not None and total > limit:
        response.close()
        raise _too_large(url, f"it is {total} bytes", limit)
    done, last = 0, time.monotonic()
    read = getattr(response, "read1", response.read)  # what has arrived, rather than waiting for a full chunk
    with response:
        while True:
            try:
                chunk = read(CHUNK)
            except TimeoutError as e:
                raise Failure(
                    f"the download of {url} stalled: no data for {stall_s:g} s after {done / 1e6:.1f} MB",
                    "retry; if it stalls again, check the network (or proxy)",
                ) from e
            except http.client.IncompleteRead as e:
                done += len(e.partial)
                break
            except (OSError, http.client.HTTPException) as e:
                raise Failure(f"the download of {url} broke off after {done / 1e6:.1f} MB: {e}", "retry") from e
            if not chunk:
                break
            done += len(chunk)
            if limit is not None and done > limit:
                raise _too_large(url, f"more than {limit} bytes came", limit)
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                progress(done, total)
                last = time.monotonic()
            yield chunk
    if total is not None and done != total:
        raise Failure(
            f"the download of {url} was cut short: {done} of {total} bytes",
            "retry; if it happens again, check the network (or proxy)",
        )


def _too_large(url: str, said: str, limit: int) -> Failure:
    return Failure(
        f"the download of {url} is larger than the {limit >> 20} MiB it may be: {said}",
        "check the url: it must name the file itself (a pin's url: regenerate the pin with the `pin` task)",
    )


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (href, text)
        self._href = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data):
        if self._href is not None:
            self.links.append((self._href, data.strip()))
            self._href = None


# What a reader takes of a PEP 691 project page: its files, each with its URL, its name and its sha256 where given
PEP_691_FILE = {"url": str, "filename": str, "hashes": MayLack({"sha256": MayLack(str)})}
PEP_691_PAGE = {"files": MayLack(list[PEP_691_FILE])}


def listed_files(
    page: str, settings: PipSettings | None = None, timeout: float = 30
) -> tuple[str, list[tuple[str, str, str | None]]]:
    """(base URL, [(url, filename, sha256 or None)]) of a PEP 691 (JSON) or PEP 503 (HTML) page."""
    response = open_url(
        page,
        settings,
        timeout,
        accept="application/vnd.pypi.simple.v1+json, text/html;q=0.1",
        fix="check the network and the index URL",
    )
    base, kind = response.geturl(), response.headers.get_content_type()
    body = b"".join(read_chunks(response, page, timeout)).decode(errors="replace")
    if kind.endswith("json"):
        try:
            listing = parse_json(body)
        except ValueError as e:
            listing = e
        if not fits(listing, PEP_691_PAGE):
            raise Failure(
                f"{page} is no project page of the shape PEP 691 gives it (files, each with its url and filename)",
                "check the index URL: it must be a package index's simple API (https://pypi.org/simple, say)",
            )
        return base, [(f["url"], f["filename"], f.get("hashes", {}).get("sha256")) for f in listing.get("files", [])]
    parser = _Links()
    parser.feed(body)
    files = []
    for href, text in parser.links:
        url, _, fragment = href.partition("#")
        sha = fragment[len("sha256=") :] if fragment.startswith("sha256=") else None
        files.append((url, text or urllib.parse.unquote(url.rsplit("/", 1)[-1]), sha))
    return base, files


def file_in(files: list[tuple[str, str, str | None]], base: str, filename: str) -> tuple[str, str | None] | None:
    for url, name, sha in files:
        if name == filename or urllib.parse.unquote(url.rsplit("/", 1)[-1]) == filename:
            return urllib.parse.urljoin(base, url), sha
    return None


def find_file(project: str, filename: str, settings: PipSettings, timeout: float = 30) -> tuple[str, str | None]:
    """(URL, the index's sha256 or None) of `filename`, looked up where pip would: find-links
    folders and pages, then each index's project page. A Failure names what was tried."""
    tried, unreachable = [], []
    pages = [f"{index.rstrip('/')}/{normalize(project)}/" for index in settings.indexes]
    for link in reversed(settings.find_links):
        if "://" in link and not link.startswith("file:"):
            pages.insert(0, link)
            continue
        folder = Path(urllib.parse.urlparse(link).path if link.startswith("file:") else link)
        if (folder / filename).is_file():
            return (folder / filename).resolve().as_uri(), None
        tried.append(str(folder))
    for page in pages:
        try:
            base, files = listed_files(page, settings, timeout)
        except HttpStatus as e:
            if e.status != 404:
                unreachable.append(e.problem)
            else:
                tried.append(page)  # the index has no such project: try the next
            continue
        except Failure as e:
            unreachable.append(e.problem)
            continue
        found = file_in(files, base, filename)
        if found:
            return found
        tried.append(page)
    if unreachable:
        raise Failure(unreachable[0], "check the network and your index settings (`pip config list`)")
    raise Failure(
        f"{filename} is on none of the indexes pip uses (tried "
        f"{', '.join(tried) or 'nothing: ' + settings.describe()})",
        "check your index settings (`pip config list`); a mirror must carry the source release",
    )
