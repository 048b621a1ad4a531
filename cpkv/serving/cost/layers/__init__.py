"""What one layer of a model costs on one GPU, by part, for the roofline model
(:mod:`cpkv.serving.cost.roofline`): ``dense`` (the attention projections, the dense MLP and
the elementwise kernels' bytes), ``attention`` (the attention kernel's FLOPs and KV reads per
pair and per context token: grouped-query, latent and sparse attention), ``experts`` (a
mixture of experts' routed GEMMs, router and shared experts, and expert parallelism's
all-to-all) and ``pipeline`` (pipeline stages: micro-batches, the slowest stage, the
activations sent between stages)."""
