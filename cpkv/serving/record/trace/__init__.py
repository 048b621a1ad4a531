"""A serving run's ``trace.json`` (``admit.serving.trace_events``): the events, streamed as
they happen (:mod:`~cpkv.serving.record.trace.events`), and the room the file needs on the
disk, checked before and while it is written (:mod:`~cpkv.serving.record.trace.file`)."""
