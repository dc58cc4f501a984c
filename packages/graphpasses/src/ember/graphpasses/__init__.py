"""ember.graphpasses: passes over ATen-level FX graphs.

The bottom layer of Ember's stack. It depends on torch alone, so anyone who wants
well-tested FX passes can install `ember-graphpasses` by itself. The layers above use
its decomposition table (what ember lowers from, and `REMAINING_OPS`, what is left to
lower) and its default pipeline. See the package README for the files in order.
"""

from ember.graphpasses.batch_norm_statistics import drop_training_running_statistics
from ember.graphpasses.channels_last import (
    channels_last_convolutions,
    channels_last_training,
    favours_channels_last,
)
from ember.graphpasses.constant_folding import fold_constants
from ember.graphpasses.conv_bias import convolution_bias_epilogue
from ember.graphpasses.cpu_linear import LinearCase, cpu_linear, linear_op
from ember.graphpasses.cse import eliminate_common_subexpressions, merge_common_subexpressions
from ember.graphpasses.dce import eliminate_dead_code
from ember.graphpasses.decompositions import (
    EMBER_ADDITIONS,
    KEEP_WHOLE,
    aot_decompositions,
    ember_decompositions,
)
from ember.graphpasses.errors import GraphPassError
from ember.graphpasses.export import (
    CustomOpProfile,
    ModuleCallRecord,
    collect_custom_op_profiles,
    collect_module_call_signatures,
    insert_custom_op_guards,
    remove_runtime_assertions,
)
from ember.graphpasses.graph_checks import check_aten_level
from ember.graphpasses.manager import PassManager, PassRecord, PassReport
from ember.graphpasses.matcher import Match, match_pattern
from ember.graphpasses.noop_removal import remove_noops
from ember.graphpasses.pad_matmul import pad_matmul
from ember.graphpasses.passes import (
    PRESERVES_CORE_ATEN,
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    PRESERVES_VALUES,
    GraphPass,
    PassResult,
    named_pass,
)
from ember.graphpasses.pattern import Pattern
from ember.graphpasses.patterns import DEFAULT_PATTERNS
from ember.graphpasses.pipelines import default_pipeline
from ember.graphpasses.pregrad import rewrite_attention_pregrad
from ember.graphpasses.remaining_ops import REMAINING_OPS
from ember.graphpasses.rewrite import rewrite_patterns
from ember.graphpasses.view_normalisation import compose_permutes, normalise_views

__all__ = [
    "DEFAULT_PATTERNS",
    "EMBER_ADDITIONS",
    "KEEP_WHOLE",
    "PRESERVES_CORE_ATEN",
    "PRESERVES_NO_MUTATION",
    "PRESERVES_RANDOMNESS",
    "PRESERVES_VALUES",
    "REMAINING_OPS",
    "CustomOpProfile",
    "GraphPass",
    "GraphPassError",
    "LinearCase",
    "Match",
    "ModuleCallRecord",
    "PassManager",
    "PassRecord",
    "PassReport",
    "PassResult",
    "Pattern",
    "aot_decompositions",
    "channels_last_convolutions",
    "channels_last_training",
    "check_aten_level",
    "collect_custom_op_profiles",
    "collect_module_call_signatures",
    "compose_permutes",
    "convolution_bias_epilogue",
    "cpu_linear",
    "default_pipeline",
    "drop_training_running_statistics",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "ember_decompositions",
    "favours_channels_last",
    "fold_constants",
    "insert_custom_op_guards",
    "linear_op",
    "match_pattern",
    "merge_common_subexpressions",
    "named_pass",
    "normalise_views",
    "pad_matmul",
    "remove_noops",
    "remove_runtime_assertions",
    "rewrite_attention_pregrad",
    "rewrite_patterns",
]
