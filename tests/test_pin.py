"""pin: the Cargo.toml blocks that pin wheels for the Rust bindings crate, from fixture wheels and
a package index on 127.0.0.1."""

import hashlib
import os
import zipfile

import pytest

from fidev.core.manifest import pins, tomllib
from module_fixtures import JIT_CACHE_WHEEL, OTHER_CUDA, make_wheel
from script_runs import run, two_line_failure


def pinned(done):
    assert done.returncode == 0, done.stderr
    return tomllib.loads(done.stdout)["package"]["metadata"]["flashinfer_rs"]["pinned_wheels"]


def test_pin_prints_the_cargo_metadata_block(tmp_path, norm_so):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    url = f"https://example.invalid/v{pins().flashinfer}/{JIT_CACHE_WHEEL}"
    table = pinned(run("pin.py", wheel, "--url", url))
    assert table == {
        "flashinfer_jit_cache": {
            pins().cuda_tag: {
                "x86_64": {
                    "filename": JIT_CACHE_WHEEL,
                    "url": url,
                    "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
                }
            }
        }
    }


def test_pin_of_a_pure_wheel_serves_every_arch_under_the_manifest_cuda(tmp_path):
    wheel = tmp_path / "apache_tvm_ffi-0.1.7-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as whl:  # pin opens it: a file cut short is refused (fault pin-unreadable)
        whl.writestr("tvm_ffi/__init__.py", "")
    table = pinned(run("pin.py", wheel, "--url", f"https://example.invalid/{wheel.name}"))
    assert set(table["apache_tvm_ffi"][pins().cuda_tag]) == {"x86_64", "aarch64"}
    assert set(
        pinned(run("pin.py", wheel, "--url", f"https://example.invalid/{wheel.name}", "--cuda", OTHER_CUDA))[
            "apache_tvm_ffi"
        ]
    ) == {OTHER_CUDA}


def test_pin_refuses_a_cuda_key_the_wheel_is_not_built_for(tmp_path, norm_so):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    two_line_failure(
        run("pin.py", wheel, "--url", f"https://example.invalid/{wheel.name}", "--cuda", OTHER_CUDA),
        f"is built for {pins().cuda_tag}, not {OTHER_CUDA}",
    )


def test_pin_needs_wheel_files(tmp_path):
    two_line_failure(run("pin.py"), "the following arguments are required: WHEEL", status=2)
    two_line_failure(run("pin.py", tmp_path), "is a folder")
    (tmp_path / "x.txt").write_text("")
    two_line_failure(run("pin.py", tmp_path / "x.txt"), "is not a wheel file")


@pytest.mark.parametrize("style", ["html", "json"])
def test_pin_takes_the_url_from_the_index_and_checks_its_sha256(tmp_path, norm_so, index_server, style):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    download = f"{index_server.url}/releases/v{pins().flashinfer}/{JIT_CACHE_WHEEL}"
    index_server.publish("flashinfer-jit-cache", [(JIT_CACHE_WHEEL, download, sha)], style)
    table = pinned(run("pin.py", wheel, "--index", f"{index_server.url}/simple"))
    assert table["flashinfer_jit_cache"][pins().cuda_tag]["x86_64"] == {
        "filename": JIT_CACHE_WHEEL,
        "url": download,
        "sha256": sha,
    }


def test_pin_says_when_the_index_lacks_the_wheel(tmp_path, norm_so, index_server):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    index_server.publish("flashinfer-jit-cache", [], "html")
    two_line_failure(run("pin.py", wheel, "--index", f"{index_server.url}/simple"), f"does not list {JIT_CACHE_WHEEL}")


def test_pin_says_when_the_index_is_unreachable(tmp_path, norm_so, index_server):
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    done = run(
        "pin.py", wheel, "--index", f"{index_server.url}/missing"
    )  # the server answers 404: no such project there
    two_line_failure(done, "cannot read the index page")
    assert "has no project flashinfer_jit_cache" in done.stderr.splitlines()[-1]
    done = run("pin.py", wheel, "--index", "http://127.0.0.1:9/simple")  # nothing listens: unreachable
    two_line_failure(done, "cannot read the index page")
    assert "where the index is reachable" in done.stderr.splitlines()[-1]


def test_pin_writes_a_wheel_named_twice_once(tmp_path, norm_so, index_server):
    """The same wheel twice, or a copy of it elsewhere: one table (TOML refuses a table defined twice)."""
    wheel = make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so)
    url = f"https://example.invalid/v{pins().flashinfer}/{JIT_CACHE_WHEEL}"
    once = run("pin.py", wheel, "--url", url)
    twice = run("pin.py", wheel, wheel, "--url", url)
    assert twice.stdout == once.stdout and twice.stdout.count("[package.") == 1, twice.stdout
    assert pinned(twice) == pinned(once)
    (tmp_path / "copy").mkdir()
    copy = tmp_path / "copy" / JIT_CACHE_WHEEL
    copy.write_bytes(wheel.read_bytes())
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    index_server.publish(
        "flashinfer-jit-cache", [(JIT_CACHE_WHEEL, f"{index_server.url}/w/{JIT_CACHE_WHEEL}", sha)], "html"
    )
    done = run("pin.py", wheel, copy, "--index", f"{index_server.url}/simple")
    assert done.stdout.count("[package.") == 1, done.stdout
    assert pinned(done)["flashinfer_jit_cache"][pins().cuda_tag]["x86_64"]["sha256"] == sha


def test_pin_refuses_two_wheels_for_one_table(tmp_path, norm_so, index_server):
    """Two releases of one package for one CUDA key and arch: two tables of one name, refused in two lines."""
    older = JIT_CACHE_WHEEL.replace(f"-{pins().flashinfer}+", "-0.0.1+")
    assert older != JIT_CACHE_WHEEL
    wheels = [make_wheel(tmp_path / JIT_CACHE_WHEEL, norm_so), make_wheel(tmp_path / older, norm_so, modules=("norm",))]
    index_server.publish(
        "flashinfer-jit-cache",
        [(w.name, f"{index_server.url}/w/{w.name}", hashlib.sha256(w.read_bytes()).hexdigest()) for w in wheels],
        "html",
    )
    done = run("pin.py", *wheels, "--index", f"{index_server.url}/simple")
    two_line_failure(
        done, f"{JIT_CACHE_WHEEL} and {older} both pin flashinfer_jit_cache for {pins().cuda_tag} on x86_64"
    )
    assert "[package." not in done.stdout


@pytest.mark.parametrize(
    "url, problem",
    [
        ("https://", "'https://' names no host"),
        ("https:///x/{name}", "names no host"),
        ("https://example.invalid/a b/{name}", "holds a space or a control character"),
        ("https://example.invalid/a\nb/{name}", "holds a space or a control character"),
        ("https://example.invalid/\udcff/{name}", "holds characters that are not ASCII"),
        ("file://elsewhere/tmp/{name}", "names a file on another host"),
        ("https://example.invalid/x.whl", "ends in 'x.whl', not the wheel's file name {name}"),
        ("https://example.invalid/{name}/", "ends in '', not the wheel's file name"),
        ("file:///dev/zero", "ends in 'zero', not the wheel's file name"),
        ("file:///tmp/%00/{name}", "names a path holding a NUL byte (%00)"),
        ("file:/tmp/{name}", "is a file URL without //"),
        ("https://example.invalid:abc/{name}", "names no port from 1 to 65535"),
        ("https://example.invalid:99999/{name}", "names no port from 1 to 65535"),
        ("https://example.invalid:0/{name}", "names no port from 1 to 65535"),
    ],
)
def test_pin_refuses_a_url_that_cannot_download_the_wheel(tmp_path, url, problem):
    """Each in two lines, and no TOML on stdout (a lone surrogate from a non-UTF-8 argument would be no TOML)."""
    wheel = tmp_path / "apache_tvm_ffi-0.1.7-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("tvm_ffi/__init__.py", "")
    done = run("pin.py", wheel, "--url", url.format(name=wheel.name))
    two_line_failure(done, problem.format(name=wheel.name), status={1, 2})
    assert done.stdout == ""


def test_pin_refuses_a_file_url_of_a_fifo_and_takes_one_of_a_file_on_another_host(tmp_path):
    wheel = tmp_path / "apache_tvm_ffi-0.1.7-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("tvm_ffi/__init__.py", "")
    (tmp_path / "served").mkdir()
    os.mkfifo(tmp_path / "served" / wheel.name)
    two_line_failure(run("pin.py", wheel, "--url", f"file://{tmp_path}/served/{wheel.name}"), "is a named pipe (FIFO)")
    url = f"file:///on/the/gpu/host/{wheel.name}"  # missing here: it may be where prefetch runs
    assert pinned(run("pin.py", wheel, "--url", url))["apache_tvm_ffi"][pins().cuda_tag]["x86_64"]["url"] == url
