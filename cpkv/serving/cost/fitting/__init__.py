"""Fitting the cost models to measurements: ``profiles`` (reading Vidur's per-operator GPU
profiles), ``roofline`` (the roofline's calibration fitted to them, ``cpkv fit-cost
--profile``), ``report`` (its calibration block and validation table), ``linear`` (the linear
model fitted to measured iterations, ``cpkv fit-cost POINTS.jsonl`` and
``admit.cost.fit_points``).
"""
