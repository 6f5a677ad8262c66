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
