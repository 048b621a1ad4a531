"""Files cpkv reads and writes: ``writes`` (atomic and streamed writes, temporary files of
dead processes), ``jsonl`` (JSON Lines input with one-line errors, strict output lines) and
``yaml_input`` (bounded YAML)."""
