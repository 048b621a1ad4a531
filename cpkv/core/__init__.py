"""The foundation every other package stands on: configs, schemas, registries, errors, timing.

Holds: ``config`` (YAML + OmegaConf overrides -> typed dataclasses; the only OmegaConf import),
``schema/`` (building and validating config dataclasses with one-line errors, keys' physical bounds), ``registry``
(string-keyed registries with lazy ``"module:attribute"`` entries), ``kinds`` (the experiment
kinds: ``kind:`` -> config class and prepare function, by lazy reference), ``errors`` (the
``CpkvError`` family the CLI prints in one line), ``files/`` (atomic writes, JSON Lines and bounded YAML input),
``timing`` (the one timing helper), ``envinfo`` (what a run ran on), ``sglang_env`` (importing
the optional real SGLang on a CPU machine), ``fastinit`` (fast constructors for frozen records).

May import: the standard library, numpy/torch/omegaconf lazily where noted. Never another cpkv
package (capabilities are reached only through the lazy references of registries).
"""
