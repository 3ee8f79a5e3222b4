"""The SGLang compatibility layer: the only modules that import ``sglang.srt``."""
