"""Iteration-time models of the serving engine (``admit.cost``), their calibration and reports.

Holds: ``base`` (the interface the engine calls, ``batch_us`` and ``breakdown``; the registry of
kinds), ``spec`` (the ``admit.cost`` block), ``roofline`` (kind ``roofline``: from the model's
shape and the GPU), ``model`` (kind ``linear``: coefficients), ``stretch`` (the durations of
a stretch of iterations whose arguments grow by constant steps, in closed form),
``graph_padding`` (a wrapper pricing decode-only batches at their CUDA-graph bucket size and
counting the padding), ``shapes`` (the model registry), ``gpus`` (the GPU registry and its
default calibration), ``calibration`` (the calibration keys), ``report`` (where a run's
time went: per timeline bucket and summed, MFU), ``fitting/`` (the models fitted to
measurements: Vidur's GPU profiles for the roofline, ``cpkv fit-cost --profile``; measured
iterations for the linear model, ``cpkv fit-cost POINTS.jsonl``).

May import: ``cpkv.core``, ``cpkv.runs``.
"""
