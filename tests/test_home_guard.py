"""The session's guard of the real HOME's caches (tests/conftest.py, tests/support/home_guard.py): it
reads the caches while a build beside the session writes them (under `affected`, FlashInfer's tests
build modules into the JIT dir smoke's session guards until its `fi` fixture imports FlashInfer),
and still sees what the session itself made, removed or touched."""

import os
import shutil
import threading
import time

import home_guard
from fidev.core.manifest import ROOT

RUNS = "fidev-upstream-runs"


def guards_snapshot(config):
    """The snapshot the session's guard takes: the root conftest's, as pytest loaded it (each suite's
    conftest is a module named `conftest` too, so it is found by its file)."""
    root = [
        p for p in config.pluginmanager.get_plugins() if getattr(p, "__file__", None) == str(ROOT / "tests/conftest.py")
    ]
    return root[0]._snapshot


def test_a_build_beside_the_walk_neither_breaks_it_nor_hides_what_stays(tmp_path, pytestconfig):
    cache = tmp_path / "flashinfer"
    (cache / "0.6.3/90a/cached_ops/norm").mkdir(parents=True)
    stays = [cache / "0.6.3/90a/cached_ops/norm" / f"norm_{i}.o" for i in range(100)]
    for path in stays:
        path.write_text("")
    stop = threading.Event()

    def build():  # a module's folder, its temporary files written and the folder removed, over and over
        n = 0
        while not stop.is_set():
            folder = cache / "0.6.3/90a/cached_ops" / f"module_{n % 4}"
            folder.mkdir(exist_ok=True)
            for i in range(20):
                (folder / f"part_{i}.o.tmp").write_text("")
            shutil.rmtree(folder)
            n += 1

    builder = threading.Thread(target=build)
    builder.start()
    try:
        deadline, walks = time.monotonic() + 30, 0
        while walks < 300 and time.monotonic() < deadline:  # a few hundred walks: the race shows within them
            found = guards_snapshot(pytestconfig)([cache])
            assert all(found[str(path)] == path.stat().st_mtime_ns for path in stays)
            walks += 1
    finally:
        stop.set()
        builder.join()


def test_a_folder_or_file_gone_between_listing_and_reading_is_absent(tmp_path, monkeypatch, pytestconfig):
    cache = tmp_path / "flashinfer"
    (cache / "module_a").mkdir(parents=True)
    (cache / "module_a/a.o").write_text("")
    (cache / "module_b").mkdir()
    (cache / "module_b/b.o").write_text("")
    (cache / "kept.o").write_text("")
    real_scandir, real_stat = os.scandir, type(cache).stat

    def scandir(path):  # module_b goes once its parent was listed, before the walk lists it
        if not isinstance(path, int) and os.fspath(path) == str(cache / "module_b"):  # rmtree scans by fd
            shutil.rmtree(path)
        return real_scandir(path)

    def stat(path, **kwargs):  # module_a/a.o goes once listed, before its time is read
        if path == cache / "module_a/a.o" and os.path.lexists(path):
            path.unlink()
        return real_stat(path, **kwargs)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(type(cache), "stat", stat)
    found = guards_snapshot(pytestconfig)([cache])
    # module_b was there when its parent's listing was read; what it held was gone before it was listed
    assert set(found) == {str(cache / p) for p in ("", "module_a", "module_b", "kept.o")}


def test_what_the_session_made_removed_or_touched_still_shows(tmp_path):
    cache, elsewhere = tmp_path / "flashinfer", tmp_path / "flashinfer-rs"
    (cache / RUNS).mkdir(parents=True)
    for name in ("removed.o", "touched.o", "kept.o"):
        (cache / name).write_text("")
    (cache / "link").symlink_to(cache / "nothing")  # a link to nothing: there, with no time, before and after
    before = home_guard.snapshot([cache, elsewhere], RUNS)
    assert before[str(elsewhere)] is None and before[str(cache / "link")] is None
    (cache / "removed.o").unlink()
    os.utime(cache / "touched.o", ns=(0, 10**9))
    (cache / "made.o").write_text("")
    (cache / RUNS / "run.json").write_text("")  # upstream-tests' run folders are not guarded
    (elsewhere / "wheels").mkdir(parents=True)
    after = home_guard.snapshot([cache, elsewhere], RUNS)
    paths = [path for path, _ in home_guard.changed(before, after, [cache, elsewhere])]
    assert sorted(set(paths)) == sorted(
        str(p)
        for p in (cache, cache / "removed.o", cache / "touched.o", cache / "made.o", elsewhere, elsewhere / "wheels")
    )
    # a cache the session stopped guarding (FlashInfer's JIT dir, once `fi` imported it) is left out
    left = home_guard.changed(before, home_guard.snapshot([elsewhere], RUNS), [elsewhere])
    assert {p for p, _ in left} == {str(elsewhere), str(elsewhere / "wheels")}
