"""One test per design decision of the Pixi manifest. Claims about what Pixi does are asserted on
Pixi's effective view of each environment, computed by tests/support/pixi_model.py the way Pixi's source
computes it (each function there names the prefix-dev/pixi file and function it follows)."""

import re
import subprocess

import pytest

from fidev.core.failure import Failure
from fidev.core.manifest import FEATURE, MANIFEST, ROOT, load_manifest, pins
from fidev.jit import activation
from pixi_model import Workspace

M = load_manifest()
PIXI = M["tool"]["pixi"]
FEAT = PIXI["feature"][FEATURE]
WS = Workspace(PIXI, M["project"])
P = pins()
NVIDIA_PACKAGES = ("cuda-nvcc", "cuda-toolkit")
CHAIN = ("preflight", "build", "import-check", "smoke", "build-abi", "abi-smoke")


def test_the_pixi_model_covers_every_table_of_the_manifest():
    assert WS.unmodelled_keys() == []


def test_flashinfer_dev_is_solved_on_its_own():
    assert [f.name for f in WS.features(FEATURE)] == [FEATURE]  # no-default-feature: nothing of `default` joins
    assert WS.solve_group(FEATURE) == [FEATURE]  # editing flashinfer-dev cannot move a shared solve


def test_nvidia_channel_ahead_of_conda_forge():
    # Design decision: NVIDIA's packages from the nvidia channel; everything else (python,
    # gxx_linux-64, ninja, pyelftools, nvidia-ml-py) from conda-forge.
    assert WS.channels(FEATURE) == ["nvidia", "conda-forge"]
    assert WS.channel_priority(FEATURE) == "strict"  # a name nvidia carries is taken from nvidia only
    assert WS.unavailable_channels(FEATURE) == []
    for pkg in NVIDIA_PACKAGES:
        assert [spec["channel"] for spec in WS.dependencies(FEATURE)[pkg]] == ["nvidia"]


def test_the_old_channel_list_would_have_left_conda_forge_out():
    # What this manifest declared before: a feature's channels replace the workspace's.
    old = Workspace(
        {**PIXI, "feature": {**PIXI["feature"], FEATURE: {**FEAT, "channels": [{"channel": "nvidia", "priority": 1}]}}}
    )
    assert old.channels(FEATURE) == ["nvidia"]


def test_cuda_12_9_is_required_by_flashinfer_dev_alone():
    # system-requirements become a platform of the feature that declares them (sysreq migration).
    assert WS.platforms(FEATURE) == {"linux-64": {"__cuda": P.cuda}}
    for env in ("default", "codex-build"):
        assert WS.platforms(env) == {"linux-64": {}}


def test_cuda_pin_is_12_9_everywhere_it_appears():
    assert P.cuda == "12.9"
    assert str(FEAT["system-requirements"]["cuda"]) == P.cuda
    for pkg in NVIDIA_PACKAGES:
        assert FEAT["dependencies"][pkg]["version"] == f"{P.cuda}.*"
    pypi = FEAT["pypi-dependencies"]
    assert pypi["torch"]["index"].rstrip("/").endswith("/" + P.cuda_tag)
    assert pypi["flashinfer-jit-cache"]["index"].rstrip("/").endswith("/" + P.cuda_tag)


def test_requires_pixi_has_every_migration_fix():
    # CHANGELOG.md of prefix-dev/pixi: the system-requirements -> platforms migration (0.71.0)
    # was fixed in 0.71.2, 0.71.3, 0.72.1 (#6517: rich variants kept out of bare-subdir
    # environments, which keeps `default` and `codex-build` CUDA-free) and 0.72.2 (#6520).
    spec = PIXI["workspace"]["requires-pixi"]
    assert re.fullmatch(r">=\s*0\.72\.2", spec), spec


def test_flashinfer_is_the_vendored_source_installed_editable():
    spec = FEAT["pypi-dependencies"]["flashinfer-python"]
    assert spec == {"path": "extern/tracked/flashinfer", "editable": True}
    assert ROOT / spec["path"] == P.source_dir


def test_vendored_source_is_a_submodule_gitlink_at_the_pinned_commit():
    gitmodules = (ROOT / ".gitmodules").read_text()
    assert "path = extern/tracked/flashinfer" in gitmodules
    assert "url = https://github.com/flashinfer-ai/flashinfer.git" in gitmodules
    staged = subprocess.run(
        ["git", "ls-files", "-s", "extern/tracked/flashinfer"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert staged[:2] == ["160000", P.source_commit]  # a gitlink: FlashInfer's files are never committed


def test_artifacts_are_locked_to_the_source_release():
    pypi = FEAT["pypi-dependencies"]
    assert P.flashinfer == "0.6.3"
    assert pypi["flashinfer-cubin"] == f"=={P.flashinfer}"
    assert P.jit_cache == f"{P.flashinfer}+{P.cuda_tag}"
    assert re.fullmatch(r"[0-9a-f]{64}", P.sdist_sha256)


def test_tvm_ffi_range_is_flashinfers():
    assert set(P.tvm_ffi_range.replace(" ", "").split(",")) == {">=0.1.6", "<0.2", "!=0.1.8", "!=0.1.8.post0"}


def test_flashinfer_dev_has_pytest():
    assert "pytest" in WS.dependencies(FEATURE, "pypi-dependencies") or "pytest" in WS.dependencies(FEATURE)


# What default and codex-build resolve from, in Pixi's effective view, as it was before
# flashinfer-dev existed. A flashinfer-dev change must leave it as it is.
_DEFAULT_DEPS = {"python": ["3.12.*"], "pip": ["*"], "pytest": [">=8"], "ruff": ["*"]}
_CODEX_DEPS = {
    "c-compiler": ["*"],
    "cxx-compiler": ["*"],
    "cmake": [">=3.28"],
    "ninja": ["*"],
    "pkg-config": ["*"],
    "rust": [">=1.80"],
    **_DEFAULT_DEPS,
}
FROZEN = {
    "solve-group": ["default", "codex-build"],
    "channels": ["conda-forge"],
    "channel-priority": "strict",
    "platforms": {"linux-64": {}},
    "dependencies": {"default": _DEFAULT_DEPS, "codex-build": _CODEX_DEPS},
    "pypi-dependencies": {"default": {}, "codex-build": {}},
}


@pytest.mark.parametrize("env", ["default", "codex-build"])
def test_default_and_codex_build_are_frozen(env):
    assert WS.resolution_inputs(env) == FROZEN
    assert WS.activation_env(env) == {}


def _all_tasks():
    yield from PIXI.get("tasks", {}).items()
    for feat in PIXI["feature"].values():
        yield from feat.get("tasks", {}).items()


def _commands(task):
    if isinstance(task, str):
        return [task]
    cmd = task.get("cmd", [])
    return [cmd] if isinstance(cmd, str) else cmd


PIP_INSTALL = re.compile(r"\bpip3?\s+install\b|\bpip\.main\(|\bensurepip\b")


def _doc_code_blocks(text):
    return re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)


def test_no_direct_pip_install_in_the_workflow():
    offenders = [f"task {n}" for n, t in _all_tasks() for c in _commands(t) if PIP_INSTALL.search(c)]
    for path in sorted((ROOT / "scripts").rglob("*.py")):
        if PIP_INSTALL.search(path.read_text()):
            offenders.append(str(path.relative_to(ROOT)))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if any(PIP_INSTALL.search(block) for block in _doc_code_blocks(path.read_text())):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"pip install bypasses the manifest and pixi.lock: {offenders}"


def test_pip_install_scanner_catches_what_it_should():
    assert PIP_INSTALL.search("python -m pip install -e .")
    assert _doc_code_blocks("x\n```bash\npip install torch\n```\n") == ["pip install torch\n"]
    assert not PIP_INSTALL.search("python -m pip download --no-deps x")


@pytest.mark.parametrize("bad", ["==0.6.*", ">=0.6.3", "0.6.3"])
def test_pins_must_be_exact(tmp_path, bad):
    text = MANIFEST.read_text().replace('flashinfer-cubin = "==0.6.3"', f'flashinfer-cubin = "{bad}"')
    (tmp_path / "pyproject.toml").write_text(text)
    with pytest.raises(Failure, match="pinned exactly"):
        pins.__wrapped__(tmp_path / "pyproject.toml")


def chain(env, last):
    """The order `pixi run -e env last` runs its tasks in: depends-on, found in the same
    environment (crates/pixi_task/src/task_graph.rs, `TaskGraph::from_root`, which looks each
    dependency up with the same `SearchEnvironments::find_task`)."""
    tasks, steps, name = WS.tasks(env), [], last
    while name:
        steps.append(name)
        deps = tasks[name][1].get("depends-on", [])
        assert len(deps) <= 1
        name = deps[0] if deps else None
    return steps[::-1]


def test_smoke_and_abi_smoke_run_their_chains():
    assert chain(FEATURE, "smoke") == ["preflight", "build", "smoke"]  # smoke proves the import itself
    assert chain(FEATURE, "import-check") == ["preflight", "build", "import-check"]
    assert chain(FEATURE, "abi-smoke") == ["preflight", "build-abi", "abi-smoke"]
    tasks = WS.tasks(FEATURE)
    assert tasks["build-abi"][1]["cmd"] == tasks["build"][1]["cmd"] + " --abi"


def test_tasks_run_in_the_environment_the_docs_name():
    for task in ("test", "lint", "fetch-flashinfer-source"):
        assert WS.task_environment(task) == "default"
        with pytest.raises(LookupError):  # no-default-feature: `pixi run -e flashinfer-dev test` is an error
            WS.task_environment(task, FEATURE)
    for task in (*CHAIN, "artifacts", "module-uri", "prefetch"):
        assert WS.task_environment(task) == WS.task_environment(task, FEATURE) == FEATURE


def test_every_flashinfer_dev_task_is_a_plain_script():
    for name, (_, task) in WS.tasks(FEATURE).items():
        cmd = task["cmd"]
        assert re.fullmatch(r"python scripts/\w+\.py( --[a-z-]+)*", cmd), f"{name}: {cmd}"  # runs without pixi too
        assert (ROOT / cmd.split()[1]).is_file(), name


def test_artifacts_tooling_is_in_flashinfer_dev():
    assert "pyelftools" in WS.dependencies(FEATURE)
    assert {"artifacts", "module-uri", "prefetch", "abi-smoke"} <= set(WS.tasks(FEATURE))


def test_activation_gives_flashinfer_dev_the_conda_layout_and_no_one_else():
    env = WS.activation_env(FEATURE)
    assert env == activation.manifest_env()  # what fidev.jit.activation applies outside Pixi
    expanded = activation.apply({}, "/p")
    assert expanded["CUDA_HOME"] == "/p"  # bin/nvcc beside its nvcc.profile, not targets/x86_64-linux/bin
    assert expanded["FLASHINFER_EXTRA_CFLAGS"].split() == ["-I/p/targets/x86_64-linux/include"]
    assert expanded["FLASHINFER_EXTRA_LDFLAGS"].split() == [
        "-L/p/targets/x86_64-linux/lib",
        "-L/p/targets/x86_64-linux/lib/stubs",
    ]
    assert expanded["CUDA_LIB_PATH"] == "/p/targets/x86_64-linux/lib"
    # the compile cache: the environment's ccache, its settings, the environment's nvcc (fidev.jit.compile_cache)
    assert expanded["FLASHINFER_NVCC"].split() == ["/p/bin/ccache", "depend_mode=true", "sloppiness=", "/p/bin/nvcc"]
    for value in env.values():
        activation.expand(value, {})  # no command substitution, which bash would run at each activation


def test_every_pixi_run_locks_flashinfer_dev_which_needs_the_source_tree():
    # Until pixi.lock is committed, `pixi run test` solves flashinfer-dev too, and its editable
    # path dependency is canonicalized (crates/pixi_uv_conversions/src/requirements.rs, as_uv_req):
    # the tree must exist before the first pixi command.
    # (pixi_model.Workspace.environments_locked_by_every_run states that rule; what can fail here is ours:)
    assert WS.dependencies(FEATURE, "pypi-dependencies")["flashinfer-python"] == [
        {"path": str(P.source_dir.relative_to(ROOT)), "editable": True}
    ]


def test_readme_gets_the_source_before_the_first_pixi_command():
    lines = [
        line.strip() for block in _doc_code_blocks((ROOT / "README.md").read_text()) for line in block.splitlines()
    ]
    first_pixi = next(i for i, line in enumerate(lines) if re.search(r"(^|\s)pixi\s", line))
    source_steps = [
        i
        for i, line in enumerate(lines)
        if "git submodule update --init --recursive" in line
        or "python3 scripts/fetch_flashinfer_source.py" in line
        or "--recurse-submodules" in line
    ]
    assert source_steps and max(source_steps) < first_pixi, lines
    assert not any("pixi run fetch-flashinfer-source" in line for line in lines)  # it would solve flashinfer-dev first
