"""The Pixi model (tests/support/pixi_model.py) must reach the outcomes Pixi's own unit tests assert, on
manifests of the same shape: crates/pixi_core/src/workspace/environment.rs, `mod tests`, at
prefix-dev/pixi v0.77.0. If Pixi's rules and the model part ways, these fail first."""

import pytest

from pixi_model import Workspace


def workspace(channels, **tables):
    return Workspace({"workspace": {"channels": channels, "platforms": ["linux-64", "osx-64"]}, **tables})


def test_channels_follow_feature_order_then_default_and_no_default_feature_drops_it():
    # test_channel_feature_priority
    ws = workspace(
        ["a", "b"],
        feature={"foo": {"channels": ["c", "d"]}, "bar": {"channels": ["e", "f"]}, "barfoo": {"channels": ["a", "f"]}},
        environments={
            "foo": ["foo"],
            "foobar": ["foo", "bar"],
            "barfoo": {"features": ["barfoo"], "no-default-feature": True},
        },
    )
    assert ws.channels("foobar") == ["c", "d", "e", "f", "a", "b"]
    assert ws.channels("foo") == ["c", "d", "a", "b"]
    assert ws.channels("barfoo") == ["a", "f"]  # "The default feature is not included in the channels"


def test_a_channel_keeps_its_first_place():
    # test_channel_feature_priority_with_redefinition
    ws = workspace(["d", "a", "b"], feature={"foo": {"channels": ["a", "c", "b"]}}, environments={"foo": ["foo"]})
    assert ws.channels("default") == ["d", "a", "b"]
    assert ws.channels("foo") == ["a", "c", "b", "d"]


def test_priority_sorts_higher_first_and_ties_keep_their_order():
    # test_channel_priorities
    ws = workspace(
        ["conda-forge"],
        feature={
            "foo": {"channels": [{"channel": "nvidia", "priority": 1}, "pytorch"]},
            "bar": {"channels": [{"channel": "bar", "priority": -10}, "barry"]},
        },
        environments={"foo": ["foo"], "bar": ["bar"], "foobar": ["foo", "bar"]},
    )
    assert ws.channels("foobar") == ["nvidia", "pytorch", "barry", "conda-forge", "bar"]
    assert ws.channels("foo") == ["nvidia", "pytorch", "conda-forge"]
    assert ws.channels("bar") == ["barry", "conda-forge", "bar"]


def test_first_listed_feature_wins_the_activation_env():
    # test_activation_env_feature_precedence
    ws = workspace(
        [],
        activation={"env": {"SHARED_VAR": "default"}},
        feature={
            "test1": {"activation": {"env": {"SHARED_VAR": "test1", "TEST1_VAR": "1"}}},
            "test2": {"activation": {"env": {"SHARED_VAR": "test2", "TEST2_VAR": "2"}}},
        },
        environments={"myenv": ["test1", "test2"]},
    )
    assert ws.activation_env("myenv") == {"SHARED_VAR": "test1", "TEST1_VAR": "1", "TEST2_VAR": "2"}
    assert ws.activation_env("default") == {"SHARED_VAR": "default"}


def test_system_requirements_of_two_features_compose_on_one_subdir():
    # test_system_requirements_compose_across_features_on_same_subdir
    ws = Workspace(
        {
            "workspace": {"channels": [], "platforms": ["linux-64"]},
            "feature": {
                "cudafeat": {"platforms": ["linux-64"], "system-requirements": {"cuda": "13.0"}},
                "libcfeat": {"platforms": ["linux-64"], "system-requirements": {"libc": "2.28"}},
            },
            "environments": {"combo": {"features": ["cudafeat", "libcfeat"]}},
        }
    )
    assert ws.platforms("combo") == {"linux-64": {"__cuda": "13.0", "__glibc": "2.28"}}


def test_feature_platforms_restrict_the_subdirs():
    # test_mixed_system_requirements_and_plain_platform_features_share_subdir
    ws = Workspace(
        {
            "workspace": {"channels": [], "platforms": ["linux-64", "linux-aarch64"]},
            "feature": {
                "cuda": {"platforms": ["linux-64"], "system-requirements": {"cuda": "13.0"}},
                "extra": {"platforms": ["linux-64"]},
            },
            "environments": {"cuda": {"features": ["cuda", "extra"]}},
        }
    )
    assert list(ws.platforms("cuda")) == ["linux-64"]


def test_tasks_come_from_the_environments_features():
    ws = workspace(
        [],
        tasks={"test": "pytest"},
        feature={"gpu": {"tasks": {"smoke": "s"}}, "cpu": {"tasks": {"lint": "x"}}},
        environments={"gpu": {"features": ["gpu"], "no-default-feature": True}, "cpu": ["cpu"], "gpu2": ["gpu"]},
    )
    assert set(ws.tasks("gpu")) == {"smoke"} and set(ws.tasks("cpu")) == {"lint", "test"}
    assert ws.task_environment("test") == "default"  # cpu has `test` too, but the same task: default wins
    assert ws.task_environment("lint") == "cpu"
    with pytest.raises(LookupError, match="ambiguous between gpu, gpu2"):
        ws.task_environment("smoke")
    with pytest.raises(LookupError, match="not available in environment 'gpu'"):
        ws.task_environment("test", "gpu")


def test_rich_platforms_are_flagged_as_unmodelled():
    ws = Workspace({"workspace": {"channels": [], "platforms": [{"name": "x", "platform": "linux-64", "cuda": "12"}]}})
    assert ws.unmodelled_keys()
