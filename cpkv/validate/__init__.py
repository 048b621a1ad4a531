"""``cpkv validate``: the cost model against published measurements of real GPUs.

Holds: ``case`` (one measurement: its source, the setup, the published numbers and the
``admit.cost`` block that describes it, read from a YAML file of ``configs/validation/``),
``predict`` (a static batch priced by the cost model, iteration by iteration: time to the
first token, time per output token, the whole batch's latency and throughput; and the
physical bounds no prediction may beat: the bytes each GPU must read, the FLOPs it must
compute, at the datasheet's peaks), ``report`` (every case of a folder: published against
predicted, the error per metric, the median and worst; the bounds checked).

May import: ``cpkv.core``, ``cpkv.runs``, ``cpkv.serving``.
"""
