"""One run, from a validated config to a self-describing directory, and reading runs back.

Holds: ``runner`` (prepare -> run directory -> execute -> results -> plots), ``rundir`` (run
directories, atomic writes, the INCOMPLETE marker, reading a run back), ``results`` (result
records: row columns identity / metrics / timing / outcomes, ``results.json``), ``report``
(tables; the only tabulate import), ``headline`` (the few numbers that stand for a run),
``listed`` (what a listing reads of a finished run: its headline and its files' digests).

May import: ``cpkv.core``. The runner reaches a kind's prepare and plot functions through the
lazy references of ``cpkv.core.kinds``, never by importing a capability.
"""
