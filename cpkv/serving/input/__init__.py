"""What a serving run is fed: ``workload`` (the ``admit.workload`` sources as serving
requests, their arrival times, the prefix cache they share) and ``arrivals`` (requests built
as they arrive, in arrival order: synthetic draws, repeated traces).

May import: ``cpkv.core``, ``cpkv.workload``, ``cpkv.trace``, ``cpkv.policies``.
"""
