"""The benchmark of FlashInfer's own tests on one GPU and on several (tools/bench_upstream.py, and
the acceptance run's bench steps, tools/gpu_acceptance.py): the selection both time."""

# Short files and one long one (tests/utils/test_sampling.py, which runs in a part per GPU).
FAMILIES = ("norm", "activation", "sampling")
