"""module-uri: the URI FlashInfer gives an attention module. The expected names are those of the
pinned release's get_*_uri; the integration test and abi-smoke compare with FlashInfer itself."""

import json

import pytest

from fidev.jit.uris import AttentionConfig, module_uri
from script_runs import run, two_line_failure

TAIL = "head_dim_qk_128_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False"


@pytest.mark.parametrize(
    "config, uri",
    [
        (
            AttentionConfig("single_prefill"),
            f"single_prefill_with_kv_cache_dtype_q_f16_dtype_kv_f16_dtype_o_f16_{TAIL}_f16qk_False",
        ),
        (
            AttentionConfig("single_prefill", backend="fa3"),
            f"single_prefill_with_kv_cache_dtype_q_f16_dtype_kv_f16_dtype_o_f16_{TAIL}_f16qk_False_sm90",
        ),
        (
            AttentionConfig("batch_prefill", backend="fa3", dtype_q="bfloat16", dtype_kv="bf16", dtype_o="bf16"),
            "batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_"
            f"{TAIL}_f16qk_False_sm90",
        ),
        (
            AttentionConfig("single_decode", dtype_kv="float8_e4m3fn"),
            f"single_decode_with_kv_cache_dtype_q_f16_dtype_kv_e4m3_dtype_o_f16_{TAIL}",
        ),
        (  # fa3's fp8 kernel: fp8 q and kv, a 16-bit output, as FlashInfer's release builds it (flashinfer/aot.py)
            AttentionConfig("batch_prefill", backend="fa3", dtype_q="float8_e4m3fn", dtype_kv="e4m3", dtype_o="bf16"),
            "batch_prefill_with_kv_cache_dtype_q_e4m3_dtype_kv_e4m3_dtype_o_bf16_dtype_idx_i32_"
            f"{TAIL}_f16qk_False_sm90",
        ),
        (
            AttentionConfig("batch_decode", head_dim_qk=64, head_dim_vo=64, posenc=1, use_logits_cap=True),
            "batch_decode_with_kv_cache_dtype_q_f16_dtype_kv_f16_dtype_o_f16_dtype_idx_i32_"
            "head_dim_qk_64_head_dim_vo_64_posenc_1_use_swa_False_use_logits_cap_True",
        ),
    ],
)
def test_uri_of_a_configuration(config, uri):
    assert module_uri(config) == uri


def test_cli_prints_the_uri_and_the_wheel_member():
    done = run("module_uri.py", "single_prefill", "--backend", "fa3", "--dtype", "bf16", "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["uri"].endswith("_f16qk_False_sm90") and "dtype_q_bf16" in info["uri"]
    assert info["member"] == f"flashinfer_jit_cache/jit_cache/{info['uri']}/{info['uri']}.so"


def test_cli_says_where_the_installed_jit_cache_stands():
    done = run("module_uri.py", "single_decode", flags=["-S"])
    assert done.returncode == 0 and done.stdout.startswith("single_decode_with_kv_cache_"), done.stderr
    assert "flashinfer-jit-cache is not installed here" in done.stderr


@pytest.mark.parametrize(
    "args, problem",
    [
        (["batch_decode", "--backend", "fa3"], "--backend applies to prefill kinds only"),
        (["single_prefill", "--dtype", "fp7"], "is not a dtype FlashInfer names"),
        (["single_decode", "--fp16-qk-reduction"], "no fp16 QK reduction variant"),
    ],
)
def test_cli_refuses_configurations_flashinfer_has_no_module_for(args, problem):
    two_line_failure(run("module_uri.py", *args), problem, status=2)  # what it refuses is what it was given: bad usage


def test_the_fp8_refusals_name_options_that_work():
    """Each fp8 refusal's fix names options; given them, module-uri names the module (FlashInfer 0.6.3's
    flashinfer/jit/attention/modules.py and its fp8 kernels: fp8 q on fa3 with fp8 kv, no fp8 output)."""
    steps = [
        (["single_prefill", "--dtype", "e5m2"], "--dtype-o f16"),
        (["single_prefill", "--dtype", "e5m2", "--dtype-o", "f16"], "--backend fa3"),
        (["single_prefill", "--backend", "fa3", "--dtype-q", "e5m2"], "--dtype-kv e5m2"),
    ]
    for args, told in steps:
        done = run("module_uri.py", *args)
        two_line_failure(done, "e5m2", status=2)
        assert told in done.stderr.splitlines()[-1], done.stderr
    done = run("module_uri.py", "single_prefill", "--backend", "fa3", "--dtype", "e5m2", "--dtype-o", "f16")
    assert done.returncode == 0 and "dtype_q_e5m2_dtype_kv_e5m2_dtype_o_f16_" in done.stdout, done.stderr
    assert done.stdout.strip().endswith("_sm90")
    done = run("module_uri.py", "single_prefill", "--dtype-kv", "e5m2")  # an fp8 KV cache alone runs on fa2
    assert done.returncode == 0 and "dtype_q_f16_dtype_kv_e5m2_dtype_o_f16_" in done.stdout, done.stderr


@pytest.mark.parametrize(
    "value, shown",
    [
        ("1048576", "1048576"),
        ("528", "528"),
        ("99999999999999999999999", "99999999... (23 digits)"),  # was "is not a whole number"
        ("9" * 5000, "99999999... (5000 digits)"),  # more digits than int() reads
    ],
    ids=["2**20", "528", "23 digits", "5000 digits"],
)
@pytest.mark.parametrize("option", ["--head-dim", "--head-dim-qk", "--head-dim-vo"])
def test_a_head_dim_above_512_is_bad_usage_naming_the_bound(option, value, shown):
    done = run("module_uri.py", "single_decode", option, value)
    two_line_failure(done, f"head dim {shown} is more than 512, the largest FlashInfer 0.6.3", status=2)
    assert done.stdout == "", done.stdout


def test_a_head_dim_of_512_or_a_negative_one_of_many_digits_is_said_as_it_is():
    done = run("module_uri.py", "single_decode", "--head-dim", "512")
    assert done.returncode == 0 and "head_dim_qk_512_head_dim_vo_512" in done.stdout, done.stderr
    two_line_failure(run("module_uri.py", "single_decode", "--head-dim", "-" + "9" * 30), "is not a positive", status=2)


@pytest.mark.parametrize("kind", ["single_prefill", "batch_decode"])
def test_the_library_bounds_a_head_dim_as_the_command_does(kind):
    """fidev.jit.uris names no module FlashInfer 0.6.3 has none of: a fa2 or decode head dim above 512 is
    refused by AttentionConfig itself (one owner of the bound; module-uri's command line reads it there)."""
    with pytest.raises(
        ValueError, match="head dim 528 is more than 512, the largest FlashInfer 0.6.3 has a module for"
    ):
        module_uri(AttentionConfig(kind, head_dim_qk=528, head_dim_vo=528))
    assert "head_dim_qk_512" in module_uri(AttentionConfig(kind, head_dim_qk=512, head_dim_vo=512))
