"""What Pixi makes of a manifest, computed the way Pixi's source computes it, so that the manifest
tests assert each environment's effective channels, platforms, tasks and activation rather than
our reading of the raw tables (a test of the raw tables once passed while flashinfer-dev could not
solve). Each function names the file and function of prefix-dev/pixi it restates; all were read at
v0.77.0. Only what a manifest of ours uses is modelled: `unmodelled_keys` lists anything else, and
test_manifest fails on it, so the model cannot silently miss a table.

`tests/test_pixi_model.py` holds the model to the outcomes Pixi's own unit tests assert.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.version import Version

PIXI = "prefix-dev/pixi v0.77.0 (e3c26fbf7d82)"
DEFAULT = "default"

# Keys the functions below interpret, per table. Anything else may change a solve unseen.
WORKSPACE_KEYS = {"name", "version", "description", "channels", "channel-priority", "platforms", "requires-pixi"}
FEATURE_KEYS = {
    "channels",
    "channel-priority",
    "platforms",
    "dependencies",
    "pypi-dependencies",
    "system-requirements",
    "activation",
    "tasks",
}
# crates/pixi_manifest/src/system_requirements.rs: the virtual package each requirement pins.
VIRTUAL_PACKAGES = {"cuda": "__cuda", "libc": "__glibc", "linux": "__linux", "macos": "__osx"}
ENVIRONMENT_KEYS = {"features", "solve-group", "no-default-feature"}
RESOLUTION_TABLES = ("dependencies", "pypi-dependencies", "system-requirements")


@dataclass(frozen=True)
class Channel:
    name: str
    priority: int  # None is 0 (features_ext.rs: `a.priority.unwrap_or(0)`)


@dataclass
class Feature:
    name: str
    table: dict = field(default_factory=dict)

    @property
    def channels(self) -> list[Channel] | None:
        raw = self.table.get("channels")
        if raw is None:
            return None
        return [Channel(c, 0) if isinstance(c, str) else Channel(c["channel"], c.get("priority", 0)) for c in raw]


class Workspace:
    """`pixi` is the `[tool.pixi]` table of a pyproject.toml, or a whole pixi.toml: the same shape."""

    def __init__(self, pixi: dict, project: dict | None = None):
        self.pixi = pixi
        self.project = project or {}
        self.workspace = pixi.get("workspace", pixi.get("project", {}))

    # ------------------------------------------------------------ features and environments

    def default_feature(self) -> Feature:
        """crates/pixi_manifest/src/toml/manifest.rs, `TomlManifest::into_workspace_manifest`: the
        top-level tables are the default feature, whose `channels` stay None ("The default feature
        does not overwrite the platforms or channels"). crates/pixi_manifest/src/pyproject.rs,
        `PyProjectManifest::into_workspace_manifest`: [project] requires-python becomes its `python`
        dependency unless it has one, and [project] dependencies its PyPI dependencies."""
        table = {k: v for k, v in self.pixi.items() if k in FEATURE_KEYS - {"channels", "platforms"}}
        deps = dict(table.get("dependencies", {}))
        if self.project and "python" not in deps:
            deps["python"] = self.project.get("requires-python", "*")
        if deps:
            table["dependencies"] = deps
        if self.project.get("dependencies"):
            table["pypi-dependencies"] = {
                **dict.fromkeys(self.project["dependencies"], "*"),
                **table.get("pypi-dependencies", {}),
            }
        return Feature(DEFAULT, table)

    def feature(self, name: str) -> Feature:
        return self.default_feature() if name == DEFAULT else Feature(name, self.pixi.get("feature", {})[name])

    def environment(self, name: str) -> dict:
        """The `default` environment exists whether declared or not; a list is the features."""
        raw = self.pixi.get("environments", {}).get(name, {} if name == DEFAULT else None)
        if raw is None:
            raise KeyError(name)
        return {"features": raw} if isinstance(raw, list) else raw

    def environments(self) -> list[str]:
        return list(dict.fromkeys([DEFAULT, *self.pixi.get("environments", {})]))

    def features(self, env: str) -> list[Feature]:
        """crates/pixi_core/src/workspace/environment.rs, `impl HasFeaturesIter for Environment`,
        `features`: the listed features in order, then the default feature unless
        `no-default-feature = true`."""
        spec = self.environment(env)
        listed = [self.feature(n) for n in spec.get("features", [])]
        return listed if spec.get("no-default-feature") else [*listed, self.default_feature()]

    def solve_group(self, env: str) -> list[str]:
        """The environments solved together with `env` (crates/pixi_core/src/workspace/solve_group.rs)."""
        group = self.environment(env).get("solve-group")
        return [e for e in self.environments() if group and self.environment(e).get("solve-group") == group] or [env]

    # ------------------------------------------------------------ what a solve sees

    def channels(self, env: str) -> list[str]:
        """crates/pixi_manifest/src/features_ext.rs, `FeaturesExt::prioritized_channels`: each
        feature's own `channels`, or the workspace's for a feature that sets none, stably sorted by
        priority (higher first), the first occurrence of a channel winning."""
        workspace = Feature("", {"channels": self.workspace.get("channels", [])}).channels
        listed = [c for f in self.features(env) for c in (f.channels if f.channels is not None else workspace)]
        ordered = sorted(listed, key=lambda c: -c.priority)  # Python's sort is stable, like itertools' sorted_by
        return list(dict.fromkeys(c.name for c in ordered))

    def channel_priority(self, env: str) -> str:
        """crates/pixi_manifest/src/features_ext.rs, `FeaturesExt::channel_priority`, over the
        features; the workspace's value sits on the default feature; unset is `Strict`
        (crates/pixi_manifest/src/workspace.rs, `ChannelPriority`, `#[default]`)."""
        values = {f.table.get("channel-priority") for f in self.features(env)} - {None}
        if any(f.name == DEFAULT for f in self.features(env)) and "channel-priority" in self.workspace:
            values.add(self.workspace["channel-priority"])
        if len(values) > 1:
            raise ValueError("Multiple channel priorities are not allowed in a single environment")
        return values.pop() if values else "strict"

    def unavailable_channels(self, env: str) -> list[tuple[str, str]]:
        """crates/pixi_command_dispatcher/src/keys/solve_pixi_environment.rs, `check_missing_channels`:
        a dependency pinned with `channel = ...` must name one of the environment's channels, else
        "Package '{package}' requested unavailable channel '{channel}'"."""
        have = set(self.channels(env))
        return [
            (name, spec["channel"])
            for name, specs in self.dependencies(env).items()
            for spec in specs
            if isinstance(spec, dict) and "channel" in spec and spec["channel"] not in have
        ]

    def platforms(self, env: str) -> dict[str, dict[str, str]]:
        """subdir -> the virtual packages its platform declares beyond the subdir's defaults.
        crates/pixi_manifest/src/toml/manifest.rs, `migrate_system_requirements_to_platforms` and
        `synthesise_for_feature`: a feature's `system-requirements` become a platform per subdir it
        targets, carrying them, and the feature is pinned to it; crates/pixi_manifest/src/
        features_ext.rs, `FeaturesExt::platforms`, and platform_composition.rs
        (`feature_supports_subdir`: no `platforms` key means every workspace platform;
        `union_virtual_packages`, since 0.72.2 over the features' customisations only): the
        environment keeps the subdirs every feature supports, each with the union of what its
        features require. Feature-level `platforms` restrict the subdirs."""
        subdirs = [p if isinstance(p, str) else p["platform"] for p in self.workspace.get("platforms", [])]
        result = {}
        for subdir in subdirs:
            features = self.features(env)
            if not all(subdir in f.table.get("platforms", subdirs) for f in features):
                continue
            required: dict[str, str] = {}
            for f in features:
                for name, version in f.table.get("system-requirements", {}).items():
                    key = VIRTUAL_PACKAGES[name]
                    version = version["version"] if isinstance(version, dict) else str(version)
                    required[key] = max(required.get(key, version), version, key=Version)
            result[subdir] = required
        return result

    def dependencies(self, env: str, table: str = "dependencies") -> dict[str, list]:
        """crates/pixi_manifest/src/features_ext.rs, `FeaturesExt::combined_dependencies` (and
        `pypi_dependencies`): `DependencyMap::merge_all` keeps every feature's spec of a name."""
        merged: dict[str, list] = {}
        for f in self.features(env):
            for name, spec in f.table.get(table, {}).items():
                merged.setdefault(name, []).append(spec)
        return merged

    def resolution_inputs(self, env: str) -> dict:
        """Everything above that decides what `env` resolves to, over its solve group."""
        group = self.solve_group(env)
        return {
            "solve-group": group,
            "channels": self.channels(env),
            "channel-priority": self.channel_priority(env),
            "platforms": self.platforms(env),
            **{
                table: {e: self.dependencies(e, table) for e in group}
                for table in ("dependencies", "pypi-dependencies")
            },
        }

    # ------------------------------------------------------------ running

    def tasks(self, env: str) -> dict[str, tuple[str, object]]:
        """name -> (the feature defining it, its definition). crates/pixi_core/src/workspace/
        environment.rs, `Environment::tasks`: the tasks of the environment's features, earlier
        features winning."""
        found = {}
        for f in reversed(self.features(env)):
            found.update({name: (f.name, task) for name, task in f.table.get("tasks", {}).items()})
        return found

    def task_environment(self, task: str, env: str | None = None) -> str:
        """Where `pixi run [-e env] task` runs. crates/pixi_task/src/task_environment.rs,
        `SearchEnvironments::find_task`: with `-e`, that environment or an error; without, the
        default environment when it has the task and no other environment has a different task of
        that name; else the one environment that has it (several is `AmbiguousTask`, resolved by a
        prompt; none is `MissingTask`). Pixi also skips environments this machine cannot run,
        which can only make an answer less ambiguous; not modelled."""
        if env is not None:
            if task not in self.tasks(env):
                raise LookupError(f"the task '{task}' is not available in environment '{env}'")
            return env
        default = self.tasks(DEFAULT).get(task)
        if default and not any(
            task in self.tasks(e) and self.tasks(e)[task][0] != default[0] for e in self.environments() if e != DEFAULT
        ):
            return DEFAULT
        having = [e for e in self.environments() if task in self.tasks(e)]
        if len(having) != 1:
            raise LookupError(
                f"task '{task}': {'ambiguous between ' + ', '.join(having) if having else 'in no environment'}"
            )
        return having[0]

    def activation_env(self, env: str) -> dict[str, str]:
        """crates/pixi_core/src/workspace/environment.rs, `Environment::activation_env`: over the
        features in order, the first to set a name wins."""
        merged: dict[str, str] = {}
        for f in self.features(env):
            for name, value in f.table.get("activation", {}).get("env", {}).items():
                merged.setdefault(name, value)
        return merged

    def environments_locked_by_every_run(self) -> list[str]:
        """crates/pixi_core/src/lock_file/outdated.rs, `find_unsatisfiable_targets`, loops over
        `project.environments()`; `pixi run` and `pixi install` call `update_lock_file`, which
        solves every outdated one, whichever environment was named. With no pixi.lock, all are."""
        return self.environments()

    # ------------------------------------------------------------ guarding the model

    def unmodelled_keys(self) -> list[str]:
        extra = [f"workspace.{k}" for k in self.workspace if k not in WORKSPACE_KEYS]
        extra += [
            f"workspace.platforms: rich entry {p}"
            for p in self.workspace.get("platforms", [])
            if not isinstance(p, str)
        ]
        extra += [k for k in self.pixi if k not in {"workspace", "project", "feature", "environments", *FEATURE_KEYS}]
        for name, table in self.pixi.get("feature", {}).items():
            extra += [f"feature.{name}.{k}" for k in table if k not in FEATURE_KEYS]
        for name in self.pixi.get("environments", {}):
            extra += [f"environments.{name}.{k}" for k in self.environment(name) if k not in ENVIRONMENT_KEYS]
        return extra
