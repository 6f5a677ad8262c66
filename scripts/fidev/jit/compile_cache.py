"""The compile cache: ccache in front of nvcc, so that what was compiled before (a revert, a branch
switched back) is not compiled again, while an edit never hides behind a hit
(docs/design.md, "The compile cache").

The route is the manifest's activation value of FLASHINFER_NVCC:
    $CONDA_PREFIX/bin/ccache depend_mode=true sloppiness= $CONDA_PREFIX/bin/nvcc
- FlashInfer 0.6.3 pastes FLASHINFER_NVCC as it is into each module's build.ninja (`nvcc = ...`) and
  compiles every .cu file with `$nvcc --generate-dependencies-with-compile --dependency-output $out.d ...`
  (flashinfer/jit/cpp_ext.py, generate_ninja_build_for_op): a command, not a path.
- ccache takes the words holding `=` after its own name as settings of this compile, above the
  environment and every config file (ccache >= 4.8: split_argv in src/ccache/ccache.cpp, and
  Config::read in src/ccache/config.cpp, "Config priority 1: command-line settings").
- SETTINGS are what keeps a hit honest. depend_mode=true: the key is the source, the command line,
  the compiler and the contents of every file nvcc's dependency file lists; ccache never runs
  `nvcc -E`, whose output is the device side's (__CUDA_ARCH__ defined), so an edit to host-only code
  would hit. ccache >= 4.12.3 reads nvcc's --generate-dependencies-with-compile and --dependency-output
  as -MD and -MF (src/ccache/argprocessing.cpp, ccache commit 2a665179); without them depend mode stays
  off for FlashInfer's rule. `sloppiness=` (none): a user's ccache.conf cannot make ccache skip system
  headers (FlashInfer's include dirs are all -isystem) or trust file times instead of contents.
The off switch is ccache's own, CCACHE_DISABLE, read by ccache at every compile (FlashInfer's own
loader included); ccache treats 0, false, no and disable there as errors. Standard library only.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fidev.core import numbers

LAUNCHER = "ccache"
VARIABLE = "FLASHINFER_NVCC"  # what FlashInfer pastes into the ninja rule
SETTINGS = ("depend_mode=true", "sloppiness=")  # the route's settings every hit relies on (above)
OFF_VARIABLE = "CCACHE_DISABLE"
TIMEOUT_S = 5
_CONFIG_LINE = re.compile(r"\((?P<origin>[^)]*)\) (?P<key>\w+) =(?: (?P<value>.*))?")


@dataclass(frozen=True)
class Route:
    """FLASHINFER_NVCC as ninja's shell runs it: ccache (where it starts with it), its settings, the compiler."""

    launcher: Path | None
    settings: tuple[str, ...]
    compiler: Path | None

    @property
    def missing(self) -> list[str]:
        """SETTINGS the route does not give ccache."""
        return [s for s in SETTINGS if s not in self.settings]


def route(value: str) -> Route:
    """Split the command as ccache does (split_argv): after the ccache executable, every word holding
    `=` is a setting, and the first word without one is the compiler."""
    try:
        words = shlex.split(value)
    except ValueError:
        words = value.split()
    if not words:
        return Route(None, (), None)
    if Path(words[0]).name != LAUNCHER:
        return Route(None, (), Path(words[0]))
    settings = []
    for word in words[1:]:
        if "=" not in word:
            break
        settings.append(word)
    rest = words[1 + len(settings) :]
    return Route(Path(words[0]), tuple(settings), Path(rest[0]) if rest else None)


def wanted() -> str:
    """The manifest's ccache range (flashinfer-dev's dependencies)."""
    from fidev.core.manifest import feature, load_manifest

    return str(feature(load_manifest()).get("dependencies", {}).get(LAUNCHER, ""))


def _ask(ccache: Path, env: Mapping[str, str], *args: str) -> str:
    """ccache's answer to a command-line option; RuntimeError with its message where it fails."""
    try:
        done = subprocess.run([str(ccache), *args], capture_output=True, text=True, timeout=TIMEOUT_S, env=dict(env))
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"{ccache} {' '.join(args)} did not run: {getattr(e, 'strerror', None) or e}") from None
    if done.returncode != 0:
        raise RuntimeError(
            (done.stderr or done.stdout).strip().splitlines()[-1]
            if (done.stderr or done.stdout).strip()
            else f"{ccache} {' '.join(args)} exited {done.returncode}"
        )
    return done.stdout


def config(ccache: Path, env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """ccache --show-config: key -> (origin, value), as the environment and its config files set them."""
    found = {}
    for line in _ask(ccache, env, "--show-config").splitlines():
        match = _CONFIG_LINE.fullmatch(line.strip())
        if match:
            found[match["key"]] = (match["origin"], match["value"] or "")
    return found


def stats(ccache: Path, env: Mapping[str, str]) -> dict[str, int]:
    """ccache --print-stats: counter -> value (cache_size_kibibyte, files_in_cache, direct_cache_hit,
    cache_miss, ...)."""
    found = {}
    for line in _ask(ccache, env, "--print-stats").splitlines():
        key, _, value = line.partition("\t")
        if (count := numbers.whole(value.strip())) is not None:
            found[key] = count
    return found


def version(ccache: Path, env: Mapping[str, str]) -> str:
    """'4.14.2' from `ccache --version`'s first line."""
    first = _ask(ccache, env, "--version").splitlines()
    match = re.search(r"version (\S+)", first[0]) if first else None
    if not match:
        raise RuntimeError(f"{ccache} --version names no version")
    return match.group(1)


def size(kibibytes: int) -> str:
    return f"{kibibytes / 2**20:.1f} GiB" if kibibytes >= 2**20 else f"{kibibytes / 2**10:.1f} MiB"


def check(env: Mapping[str, str] = os.environ) -> tuple[str, str, str]:
    """Preflight's compile-cache line, (status, finding, fix): whether builds go through the cache,
    where it is, how large, and whether it is on."""
    from fidev.core.versions import in_range
    from fidev.jit import activation

    value, r = env.get(VARIABLE, ""), route(env.get(VARIABLE, ""))
    manifest_value = activation.manifest_env([VARIABLE]).get(VARIABLE, "")
    fix = f"run it inside the environment, whose activation sets {VARIABLE}={manifest_value!r}"
    if VARIABLE in env and not value.strip():  # FlashInfer pastes it as is: os.environ.get(VARIABLE, default)
        return (
            "fail",
            f"{VARIABLE} is set but empty: FlashInfer 0.6.3 puts it in every module's ninja rule as it is "
            "(flashinfer/jit/cpp_ext.py, generate_ninja_build_for_op), so every CUDA source would compile "
            "with no compiler",
            f"unset {VARIABLE}, or {fix}",
        )
    if r.launcher is None:
        said = f"is {value!r}" if VARIABLE in env else "is unset"
        return "warn", f"not in use: {VARIABLE} {said}, so a revert compiles again what it compiled before", fix
    if r.missing or r.compiler is None:
        lacks = " ".join(r.missing) if r.missing else "a compiler after its settings"
        why = 'a hit could hide an edit (docs/design.md, "The compile cache")'
        return "fail", f"{VARIABLE} runs ccache without {lacks}: {why}", fix
    try:
        found = version(r.launcher, env)
        settings, counters = config(r.launcher, env), stats(r.launcher, env)
    except RuntimeError as e:
        if "CCACHE_" in str(e):  # ccache refuses a variable's value (CCACHE_DISABLE=0): every compile would fail
            return "fail", f"ccache refuses the environment: {e}", "unset the CCACHE_* variable it names, or correct it"
        return "fail", f"ccache cannot serve the builds: {e}", "pixi install -e flashinfer-dev (the manifest's ccache)"
    manifest_range = wanted()  # the manifest, read once
    if manifest_range and not in_range(found, manifest_range):
        return (
            "fail",
            f"ccache {found} ({r.launcher}) is outside the manifest's {manifest_range}: an older one does not "
            "read nvcc's dependency options, and without depend mode a hit could hide an edit",
            "pixi install -e flashinfer-dev",
        )
    return described(found, settings, counters)


def described(found: str, settings: dict[str, tuple[str, str]], counters: dict[str, int]) -> tuple[str, str, str]:
    """The line of a cache that can serve the builds: where it is, its size, whether it is on."""
    place = settings.get("cache_dir", ("", "?"))[1]
    remote = " plus remote storage" if settings.get("remote_storage", ("", ""))[1] else ""
    held = f"{size(counters.get('cache_size_kibibyte', 0))} in {counters.get('files_in_cache', 0)} files"
    limit = counters.get("max_cache_size_kibibyte", 0)
    where = f"ccache {found}, {place}{remote}: {held}" + (f" of {size(limit)}" if limit else "")
    origin, off = settings.get("disable", ("default", "false"))
    if off == "true":
        why = f"{OFF_VARIABLE} is set" if origin == "environment" else f"disable = true in {origin}"
        return "pass", f"off ({why}): every compile runs nvcc; {where}", ""
    return "pass", f"on, a hit only for the same source, flags, compiler and headers (depend mode); {where}", ""
