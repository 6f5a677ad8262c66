"""The URI (module name) FlashInfer gives an attention JIT module, from its configuration.

A binding loads `<uri>/<uri>.so`, so it must name the module exactly as FlashInfer does. This is
the naming of the pinned release (flashinfer/jit/attention/modules.py, get_*_uri), restated
without torch so that it answers in milliseconds. Two tests hold it to FlashInfer's own
functions: the integration test (CPU, against the pinned source release) and abi-smoke (GPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

KINDS = ("single_prefill", "batch_prefill", "single_decode", "batch_decode")
BACKENDS = ("fa2", "fa3")
POSENC = {"none": 0, "rope_llama": 1, "alibi": 2}  # FlashInfer's PosEncodingMode values

# FlashInfer's filename-safe dtype names, and the torch spellings that map to them.
DTYPES = {
    "f16": "f16",
    "bf16": "bf16",
    "e4m3": "e4m3",
    "e5m2": "e5m2",
    "i8": "i8",
    "u8": "u8",
    "i32": "i32",
    "u32": "u32",
    "i64": "i64",
    "u64": "u64",
    "float16": "f16",
    "half": "f16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
    "int8": "i8",
    "uint8": "u8",
    "int32": "i32",
    "uint32": "u32",
    "int64": "i64",
    "uint64": "u64",
}

FP8 = ("e4m3", "e5m2")
ATTENTION_DTYPES = ("f16", "bf16", *FP8)
OUTPUT_DTYPES = ("f16", "bf16")
INDEX_DTYPES = ("i32",)  # the page and index arrays are int32 (IdType) in every attention binding


class Refused(ValueError):
    """A configuration FlashInfer has no module for, with the options that name one it has."""

    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.fix = fix


def dtype(name: str) -> str:
    """FlashInfer's name of a dtype, from that name or torch's (float16 -> f16)."""
    if name not in DTYPES:
        raise ValueError(f"{name!r} is not a dtype FlashInfer names ({', '.join(sorted(set(DTYPES.values())))})")
    return DTYPES[name]


# The largest head dim named: FlashInfer 0.6.3 builds and tests none larger (the largest, MLA's head_dim_ckv, is
# 512: flashinfer/aot.py; its attention tests take 64, 128 and 256). Its fa2 and decode kernels have no static
# bound, but fa2 prefill's KernelTraits::IsInvalid (include/flashinfer/attention/prefill.cuh) refuses every launch
# once NUM_MMA_Q * (8 * NUM_MMA_D_VO + 2 * sizeof(DTypeQKAccum) * NUM_MMA_KV) >= 256, that is a head_dim_vo above
# 480 (496 with fp16 QK reduction); fa3's own head dims are checked below (AttentionConfig).
MOST_HEAD_DIM = 512


def too_large(shown: str) -> str:
    """What a head dim above MOST_HEAD_DIM is said to be (`shown`: it, or its first digits)."""
    return f"head dim {shown} is more than {MOST_HEAD_DIM}, the largest FlashInfer 0.6.3 has a module for"


def head_dim(value: int) -> int:
    # fa2 tiles the head dim in 16-wide MMA steps (NUM_MMA_D = HEAD_DIM / 16 in
    # include/flashinfer/attention/prefill.cuh); decode splits it into 16-byte vectors
    # (attention/decode.cuh).
    if value <= 0 or value % 16:
        raise ValueError(f"{value} is not a positive multiple of 16")
    if value > MOST_HEAD_DIM:
        raise ValueError(too_large(str(value)))
    return value


# The fields of each kind's URI, in FlashInfer's order. Batch kinds carry the index dtype;
# prefill kinds carry the fp16 QK reduction flag and, for fa3, the `_sm90` suffix.
_FIELDS = (
    "dtype_q",
    "dtype_kv",
    "dtype_o",
    "dtype_idx",
    "head_dim_qk",
    "head_dim_vo",
    "posenc",
    "use_swa",
    "use_logits_cap",
    "f16qk",
)


@dataclass(frozen=True)
class AttentionConfig:
    kind: str
    backend: str = "fa2"
    dtype_q: str = "f16"
    dtype_kv: str = "f16"
    dtype_o: str = "f16"
    dtype_idx: str = "i32"
    head_dim_qk: int = 128
    head_dim_vo: int = 128
    posenc: int = 0
    use_swa: bool = False
    use_logits_cap: bool = False
    f16qk: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown module kind {self.kind!r}; one of {', '.join(KINDS)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; one of {', '.join(BACKENDS)}")
        if self.backend == "fa3" and self.kind.endswith("decode"):
            raise ValueError(
                f"{self.kind} modules have no fa3 variant (tensor-core decode runs on the batch_prefill module)"
            )
        if self.f16qk and self.kind.endswith("decode"):
            raise ValueError(f"{self.kind} has no fp16 QK reduction variant")
        if self.posenc not in POSENC.values():
            raise ValueError(f"posenc {self.posenc} is not one of {sorted(POSENC.values())}")
        for field in ("dtype_q", "dtype_kv", "dtype_o", "dtype_idx"):
            try:
                object.__setattr__(self, field, dtype(getattr(self, field)))
            except ValueError as e:
                raise ValueError(f"{field} {e}") from None
        self._check_buildable()

    def _check_buildable(self):
        """What FlashInfer 0.6.3 can build, so that no URI names a module that cannot exist."""
        for field in ("dtype_q", "dtype_kv"):
            if getattr(self, field) not in ATTENTION_DTYPES:
                raise ValueError(
                    f"{field} {getattr(self, field)} is not an attention dtype ({', '.join(ATTENTION_DTYPES)})"
                )
        self._check_fp8()
        if self.dtype_o not in OUTPUT_DTYPES:
            raise ValueError(f"dtype_o {self.dtype_o} is not an output dtype ({', '.join(OUTPUT_DTYPES)})")
        if self.dtype_idx not in INDEX_DTYPES:
            raise ValueError(f"dtype_idx {self.dtype_idx} is not an index dtype ({', '.join(INDEX_DTYPES)})")
        for field in ("head_dim_qk", "head_dim_vo"):
            try:
                head_dim(getattr(self, field))
            except ValueError as e:
                raise ValueError(f"{field} {e}") from None
        if self.backend == "fa3":
            # include/flashinfer/attention/hopper/prefill_sm90.cuh: HEAD_DIM_VO in {64, 128, 256},
            # equal to HEAD_DIM_QK except the (192, 128) pair.
            pair = (self.head_dim_qk, self.head_dim_vo)
            if pair != (192, 128) and (self.head_dim_vo not in (64, 128, 256) or self.head_dim_qk != self.head_dim_vo):
                raise ValueError(
                    f"fa3 has no head dims {pair[0]}/{pair[1]}: it takes 64, 128 or 256 for both, or 192/128"
                )

    def _check_fp8(self):
        """fp8 as FlashInfer 0.6.3 builds it. Its get_*_uri name fp8 for q, kv and o alike
        (filename_safe_dtype_map, flashinfer/jit/utils.py); what its modules take: fp8 queries on fa3
        prefill alone, with fp8 KV; no fp8 output. An fp8 KV cache with 16-bit queries is named
        (fa2 and decode build it; on fa3 the release's flashinfer/aot.py builds none, and this does
        not refuse it)."""
        if self.dtype_o in FP8:
            # gen_batch_prefill_module: `assert dtype_o not in [torch.float8_e4m3fn, torch.float8_e5m2]`; the
            # release's modules (flashinfer/aot.py, gen_fa2/gen_fa3) write f16 or bf16 whatever q and kv are
            raise Refused(
                f"dtype_o {self.dtype_o}: FlashInfer 0.6.3 has no fp8 attention output (gen_batch_prefill_module, "
                "flashinfer/jit/attention/modules.py, asserts 'FP8 output is not supported in fa2/fa3 backends yet'; "
                "its release's modules, flashinfer/aot.py, write f16 or bf16)",
                f"--dtype sets q, kv and o: keep o 16-bit (--dtype-o f16 or bf16), or give {self.dtype_o} to the "
                f"KV cache alone (--dtype-kv {self.dtype_o})",
            )
        if self.backend == "fa2" and self.kind.endswith("prefill") and self.dtype_q in FP8:
            # gen_single_prefill_module and gen_batch_prefill_module (flashinfer/jit/attention/modules.py):
            # `assert not fp8_enabled, "fp8 tensor core is not supported in fa2 backend"`, fp8_enabled = dtype_q fp8
            raise Refused(
                f"fa2 has no fp8 ({self.dtype_q}) queries: gen_{self.kind}_module asserts 'fp8 tensor core is not "
                "supported in fa2 backend' (flashinfer/jit/attention/modules.py)",
                f"fp8 queries run on fa3 with fp8 KV (--backend fa3 --dtype {self.dtype_q} --dtype-o f16); on fa2 "
                f"give {self.dtype_q} to the KV cache alone (--dtype-kv {self.dtype_q})",
            )
        if self.backend == "fa3" and self.dtype_q in FP8 and self.dtype_kv not in FP8:
            # the fp8 kernels' FP8AttentionKernelTraits (single and batch), in
            # include/flashinfer/attention/hopper/quantization/kernel_traits.cuh: TranposeTraits_64x64<..., DTypeKV,
            # ...> holds `static_assert(cutlass::sizeof_bits_v<TransElement> == 8)`
            raise Refused(
                f"fa3's fp8 kernel takes fp8 ({self.dtype_q}) queries with fp8 KV only, not {self.dtype_kv}: its "
                "FP8AttentionKernelTraits (include/flashinfer/attention/hopper/quantization/kernel_traits.cuh) "
                "asserts an 8-bit KV at compile time",
                f"give the KV cache {self.dtype_q} too (--dtype-kv {self.dtype_q})",
            )


def fields(config: AttentionConfig) -> list[str]:
    batch, prefill = config.kind.startswith("batch"), config.kind.endswith("prefill")
    return [f for f in _FIELDS if (f != "dtype_idx" or batch) and (f != "f16qk" or prefill)]


def module_uri(config: AttentionConfig) -> str:
    values = asdict(config)
    parts = [f"{config.kind}_with_kv_cache"] + [f"{field}_{values[field]}" for field in fields(config)]
    suffix = "_sm90" if config.backend == "fa3" else ""
    return "_".join(parts) + suffix


JIT_CACHE_PACKAGE = "flashinfer_jit_cache"
MODULES_IN_PACKAGE = "jit_cache"


def library_member(uri: str) -> str:
    """Where a module sits inside the flashinfer-jit-cache wheel (and its installed package)."""
    return f"{JIT_CACHE_PACKAGE}/{MODULES_IN_PACKAGE}/{uri}/{uri}.so"
