"""The flashinfer-dev environment's activation env, read from the manifest and expanded the way
Pixi's activation does, so that code outside Pixi (preflight's fix lines, the conda-layout test
prefix) uses the manifest's values instead of restating them.

How Pixi applies it (prefix-dev/pixi v0.77.0): `get_activator` in crates/pixi_core/src/activation.rs
puts `Environment::activation_env` into rattler_shell's `post_activation_env_vars`, which are
written after the packages' activation scripts; rattler_shell's `Bash::set_env_var` writes a
value holding `$` as `export NAME="value"`, and Pixi runs that script in bash. So each value is
expanded once, in manifest order, with $CONDA_PREFIX already set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from fidev.core.failure import Failure
from fidev.core.manifest import FEATURE, MANIFEST, feature, load_manifest

_REFERENCE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def manifest_env(names: Iterable[str] | None = None) -> dict[str, str]:
    """The raw values of `[tool.pixi.feature.flashinfer-dev.activation.env]`, in manifest order; two
    lines where the table or a value in it is of another type."""
    activation = feature(load_manifest()).get("activation", {})
    table = activation.get("env", {}) if isinstance(activation, dict) else None
    if not (isinstance(table, dict) and all(isinstance(v, str) for v in table.values())):
        raise Failure(
            f"{MANIFEST.name}: [tool.pixi.feature.{FEATURE}.activation.env] is not a table of strings",
            f"write each variable as NAME = \"value\" (`git diff {MANIFEST.name}` shows what changed)",
        )
    return {k: v for k, v in table.items() if names is None or k in names}


def expand(value: str, env: Mapping[str, str]) -> str:
    """What bash makes of `"value"`: $NAME and ${NAME} replaced, an unset name by nothing."""
    if "$(" in value or "`" in value:
        raise ValueError(f"{value!r}: command substitution would run at every activation")
    return _REFERENCE.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)


def apply(env: Mapping[str, str], prefix: str) -> dict[str, str]:
    """`env` as `pixi run` hands it to a task: CONDA_PREFIX set, then the activation env expanded
    in order (a later value may use an earlier one)."""
    result = dict(env, CONDA_PREFIX=prefix)
    for name, value in manifest_env().items():
        result[name] = expand(value, result)
    return result
