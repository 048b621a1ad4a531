"""Iteration-time models of the serving loop (``admit.cost``), their calibration and reports.

Holds: ``base`` (the interface the loop calls, ``batch_us`` and ``breakdown``; the registry of
kinds), ``spec`` (the ``admit.cost`` block), ``roofline`` (kind ``roofline``: from the model's
shape and the GPU), ``model`` (kind ``linear``: coefficients), ``stretch`` (the durations of
a stretch of iterations whose arguments grow by constant steps, in closed form),
``graph_padding`` (a wrapper pricing decode-only batches at their CUDA-graph bucket size and
counting the padding), ``shapes`` (the model registry), ``gpus`` (the GPU registry and its
default calibration), ``calibration`` (the calibration keys), ``profiles`` (reading Vidur's
GPU profiles), ``calibrate`` (fitting the roofline to them, ``cpkv fit-cost --profile``),
``calibration_report`` (its block and validation table), ``fit`` (kind linear from measured
iterations, ``cpkv fit-cost POINTS.jsonl``), ``report`` (where a run's time went: per
timeline bucket and summed, MFU).

May import: ``cpkv.core``, ``cpkv.runs``.
"""
