"""The patterns ember ships, in priority order (bigger patterns first).

Each module holds one family with its reasons; `DEFAULT_PATTERNS` is what the default
pipeline's pattern rewrite applies.
"""

from ember.graphpasses.patterns.attention import ATTENTION_PATTERNS
from ember.graphpasses.patterns.gelu import GELU_PATTERNS
from ember.graphpasses.patterns.matmul_bias import MATMUL_BIAS_PATTERNS

DEFAULT_PATTERNS = (*ATTENTION_PATTERNS, *GELU_PATTERNS, *MATMUL_BIAS_PATTERNS)

__all__ = ["ATTENTION_PATTERNS", "DEFAULT_PATTERNS", "GELU_PATTERNS", "MATMUL_BIAS_PATTERNS"]
